"""The smoke test: is every host of a slice alive, and does a collective over all its chips finish?

On every host of a reservation (one Ray actor per bundle, as :mod:`raytpu_lab.reservations.spmd`
starts them), :func:`jax_probe` initialises ``jax.distributed`` (unless the host process has it
already), reads ``jax.process_index()``, ``jax.device_count()`` and ``jax.local_device_count()``,
and runs a ``psum`` of ones over every device of the reservation twice, blocking on each with
``block_until_ready`` (without it JAX returns before the chips have done anything; see
kubeflow/trainer#3531). The sum must equal the reservation's chip count. A host that raises is
``error`` with its last traceback line; one silent for ``timeout_s`` seconds is ``timeout``, named
by slice and worker id; its process is killed, so nothing is left behind.

:func:`check_slices` does the same for every idle intact slice of the cluster, each reserved for
the check (placement groups ``raytpu:check-<slice>``) and released after.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from raytpu_lab.errors import RemoteHostError
from raytpu_lab.reservations.check_report import CheckReport, HostCheck
from raytpu_lab.reservations.slices import Reservation, reserve_slices
from raytpu_lab.reservations.spmd import SliceSession, collect
from raytpu_lab.state.snapshot import ClusterSnapshot
from raytpu_lab.tpu.topology import SliceShape

__all__ = ["check_reservation", "check_slices", "jax_probe"]

Probe = Callable[[int, int, "str | None", float], dict[str, Any]]


def jax_probe(rank: int, num_processes: int, coordinator: str | None,
              timeout_s: float) -> dict[str, Any]:
    """Runs on one host: ``jax.distributed`` (if ``coordinator``), device counts, a blocked psum.

    Args:
        rank: This host's process index.
        num_processes: Hosts in the reservation.
        coordinator: ``HOST:PORT`` of rank 0's coordinator, or ``None`` if this process has
            initialised ``jax.distributed`` already (a running per-host session).
        timeout_s: Seconds ``jax.distributed.initialize`` may wait for the other hosts.

    Returns:
        ``process_index``, ``process_count``, ``device_count``, ``local_device_count``,
        ``psum`` (float) and the seconds ``init_s``, ``first_s``, ``collective_s``.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np

    start = time.monotonic()
    if coordinator is not None:
        jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=rank,
                                   initialization_timeout=max(int(timeout_s), 1))
    init_s = time.monotonic() - start
    summed = jax.pmap(lambda x: jax.lax.psum(x, "i"), axis_name="i")
    ones = jnp.ones(jax.local_device_count())
    t0 = time.monotonic()
    summed(ones).block_until_ready()
    t1 = time.monotonic()
    out = summed(ones).block_until_ready()
    t2 = time.monotonic()
    value = float(np.asarray(out.addressable_shards[0].data).ravel()[0])
    return {"process_index": jax.process_index(), "process_count": jax.process_count(),
            "device_count": jax.device_count(), "local_device_count": jax.local_device_count(),
            "psum": value, "init_s": init_s, "first_s": t1 - t0, "collective_s": t2 - t1}


def _host_row(res: Reservation, rank: int, slot: Any, raw: dict[str, Any] | None,
              timeout_s: float) -> HostCheck:
    row = HostCheck(slot.slice_name, slot.worker_id, slot.ip, rank, "ok", reservation=res.name,
                    expected_devices=res.num_chips, expected_local=res.shape.chips_per_host)
    if raw is None:
        row.status, row.detail = "timeout", f"no answer within {timeout_s:.0f} s"
        return row
    if raw.get("error"):
        row.status = "error"
        row.detail = str(raw["error"]).strip().splitlines()[-1][:200]
        return row
    value = raw.get("value") or {}
    for key in ("process_index", "process_count", "device_count", "local_device_count", "psum",
                "init_s", "first_s", "collective_s"):
        setattr(row, key, value.get(key))
    wrong = []
    if row.device_count != row.expected_devices:
        wrong.append(f"{row.device_count} devices, want {row.expected_devices}")
    if row.local_device_count != row.expected_local:
        wrong.append(f"{row.local_device_count} local devices, want {row.expected_local}")
    if row.process_index != rank:
        wrong.append(f"process index {row.process_index}, want {rank}")
    if row.psum != float(row.expected_devices):
        wrong.append(f"psum {row.psum}, want {row.expected_devices}")
    if wrong:
        row.status, row.detail = "wrong", "; ".join(wrong)
    return row


def check_reservation(res: Reservation, *, timeout_s: float = 60.0,
                      session: SliceSession | None = None,
                      probe: Probe = jax_probe) -> CheckReport:
    """Smoke-test every host of ``res`` (see the module docstring).

    Args:
        res: A placed reservation.
        timeout_s: Seconds each phase (starting the host processes, then the probe) may take;
            a host silent that long is reported as ``timeout``.
        session: The reservation's running per-host session, whose processes have
            ``jax.distributed`` already (the probe then runs in them, and the session is closed
            if a host hangs); ``None``: temporary processes, stopped after.
        probe: The per-host check, ``probe(rank, num_processes, coordinator, timeout_s) -> dict``
            (default :func:`jax_probe`; tests pass one that fails on one host).

    Returns:
        One row per host, in rank order. It does not raise for a failing host: it names it.
    """
    start = time.monotonic()
    if session is not None and session.started:
        refs = session.submit_each(probe, [(rank, len(session.hosts), None, timeout_s)
                                           for rank in range(len(session.hosts))])
        raws = collect(refs, timeout_s)
        if any(raw is None for raw in raws):
            session.close()  # its processes are stuck in the probe: the next cell starts fresh ones
        return CheckReport(_rows(res, session, raws, timeout_s), timeout_s, time.monotonic() - start)
    return CheckReport(_check_all([res], timeout_s, probe), timeout_s, time.monotonic() - start)


def _rows(res: Reservation, hosts: SliceSession, raws: list[dict[str, Any] | None],
          timeout_s: float) -> list[HostCheck]:
    return [_host_row(res, rank, slot, raw, timeout_s)
            for rank, (slot, raw) in enumerate(zip(hosts.hosts, raws, strict=True))]


def check_slices(snap: ClusterSnapshot, *, timeout_s: float = 60.0,
                 probe: Probe = jax_probe) -> CheckReport:
    """Smoke-test every idle intact slice of ``snap``: each is reserved alone for the check
    (``raytpu:check-<slice>``), checked (all at once), and released, also on error.

    Slices that are degraded, of an unknown shape, or in use are listed as ``not checked``
    with the reason.

    Args:
        snap: The cluster now (the session's reader).
        timeout_s: As :func:`check_reservation`; also the wait for each slice's reservation.
        probe: As :func:`check_reservation`.

    Returns:
        Every host of the checked slices, then one row per slice not checked.
    """
    start = time.monotonic()
    skipped: list[HostCheck] = []
    held: list[Reservation] = []
    try:
        for s in snap.slices:
            if not isinstance(s.shape, SliceShape) or s.health != "intact":
                why = "; ".join(s.reasons) or "unknown shape"
                skipped.append(HostCheck(s.name, -1, "", 0, "not checked", detail=f"degraded: {why}"))
                continue
            if not s.idle:
                skipped.append(HostCheck(s.name, -1, "", 0, "not checked",
                                         detail=f"in use ({', '.join(s.owners) or s.state})"))
                continue
            res = reserve_slices(s.shape, [s.name], name=f"check-{s.name}",
                                 timeout_s=min(timeout_s, 10.0))
            if res is None:
                skipped.append(HostCheck(s.name, -1, "", 0, "not checked",
                                         detail="taken by someone else meanwhile"))
            else:
                held.append(res)
        rows = _check_all(held, timeout_s, probe)
    finally:
        for res in held:
            res.release()
    return CheckReport(rows + skipped, timeout_s, time.monotonic() - start)


def _check_all(held: list[Reservation], timeout_s: float, probe: Probe) -> list[HostCheck]:
    """Check several reservations at once in temporary host processes (start all, probe all,
    then wait: one timeout in all); the processes are stopped after, also on error."""
    sessions = [SliceSession(res, init_jax=False, timeout_s=timeout_s) for res in held]
    rows: list[HostCheck] = []
    try:
        started: list[tuple[Reservation, SliceSession, list[Any]]] = []
        for res, hosts in zip(held, sessions, strict=True):
            try:
                hosts.start()
                n = len(hosts.hosts)
                coordinator = hosts.coordinator()
            except RemoteHostError as err:
                rows.extend(HostCheck(s, -1, "", 0, "timeout" if "within" in err.what else "error",
                                      reservation=res.name, detail=f"{err.what} {err.why}".strip())
                            for s in res.slice_names)
                continue
            refs = hosts.submit_each(probe, [(rank, n, coordinator, timeout_s) for rank in range(n)])
            started.append((res, hosts, refs))
        deadline = time.monotonic() + timeout_s
        for res, hosts, refs in started:
            rows.extend(_rows(res, hosts, collect(refs, max(deadline - time.monotonic(), 0.1)),
                              timeout_s))
    finally:
        for hosts in sessions:
            hosts.close()
    return rows
