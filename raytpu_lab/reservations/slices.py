"""Slice reservations: whole TPU slices held through ``ray.util.tpu.slice_placement_group``.

A reservation is a :class:`ray.util.tpu.SlicePlacementGroup` pinned to slices we chose from our
own snapshot, plus a head lock per slice:

1. Pick intact, idle slices of the pod type from the snapshot (chips and head all free; Ray omits
   exhausted resources, so missing availability counts as zero). Ray's own
   ``get_num_ready_tpu_slices`` reads a missing key as "all free", and its head-first scheduling
   can win the head of a busy or broken slice and then wait forever for the rest.
2. Take the slice's head lock: a placement group on ``TPU-<pod type>-head`` (the resource Ray puts
   on worker 0 and that ``JaxTrainer`` and ``slice_placement_group`` claim first), pinned to that
   slice, with the reservation's lifetime. Holding it keeps other Ray users off the slice.
3. Reserve every host through ``slice_placement_group(..., bundle_label_selector=[{slice name}])``:
   Ray gang-schedules the bundles atomically, one per host.
4. Every wait is bounded by the timeout; what was half made is removed before trying the next
   slices or raising. Drivers racing from the same snapshot pick among idle slices at random,
   and a pick whose head lock is not placed within ~2 s (another driver got that head) is
   dropped for a fresh snapshot and a new pick, so losers move on to other idle slices.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.tpu import SlicePlacementGroup, slice_placement_group

from raytpu_lab.advice import Text, cmd, opt
from raytpu_lab.errors import NoSliceAvailableError
from raytpu_lab.reservations.info import ReservationInfo, head_lock_name, reservation_group_name
from raytpu_lab.state.snapshot import ClusterSnapshot
from raytpu_lab.tpu.labels import LABEL_SLICE, LABEL_WORKER, RESERVATION_PREFIX
from raytpu_lab.tpu.topology import SliceShape

__all__ = ["Reservation", "reserve", "reserve_slices", "lend_chips", "retake_chips", "adopt",
           "diagnose", "RESERVATION_PREFIX"]

_HEAD_ATTEMPT_S = 2.0
"""Seconds one pick waits for its head locks before choosing again (placing one takes ~10 ms)."""
_CHIPS_ATTEMPT_S = 5.0
"""Seconds one pick waits for its chips once the heads are held."""


@dataclass
class Reservation:
    """Whole TPU slices held by this session.

    Attributes:
        name: The reservation's name (placement group ``"raytpu:<name>"``).
        shape: Generation and topology of each slice.
        slice_names: The reserved slices, e.g. ``["tpu-v6e-4x4-1"]``.
        handle: Ray's ``SlicePlacementGroup``; its placement group has one bundle per host,
            ``shape.chips_per_host`` TPU each. ``None`` for a reservation adopted from another
            driver (:func:`adopt`), which holds only the placement group (``adopted_group``).
        head_locks: One placement group per slice on ``TPU-<pod type>-head``.
        detached: Whether it outlives the kernel that made it.
        created_at: Seconds since the epoch.
        adopted_group: The placement group of an adopted reservation (``handle`` is ``None``).
        lent_to: What holds its chips while they are lent (e.g. ``"serve app echo"``), or ``""``.
    """

    name: str
    shape: SliceShape
    slice_names: list[str]
    handle: SlicePlacementGroup | None
    head_locks: list[PlacementGroup] = field(default_factory=list)
    detached: bool = False
    created_at: float = field(default_factory=time.time)
    adopted_group: PlacementGroup | None = None
    lent_to: str = ""

    @property
    def placement_group(self) -> PlacementGroup:
        """The placement group holding every host (bundle i on one host of the slices)."""
        pg = self.handle.placement_group if self.handle is not None else self.adopted_group
        if pg is None and self.lent_to:
            from raytpu_lab.errors import ReservationError

            raise ReservationError(f"Reservation {self.name!r} lends its chips to {self.lent_to}.",
                                   why="Its slices' chips are held by that deployment's replicas.",
                                   fix=("Delete it first: ", cmd("serve-delete", self.lent_to.split()[-1])))
        if pg is None:
            raise RuntimeError(f"reservation {self.name!r} was released")
        return pg

    @property
    def num_hosts(self) -> int:
        """Hosts held, all slices together."""
        return self.shape.num_hosts * len(self.slice_names)

    @property
    def num_chips(self) -> int:
        """Chips held, all slices together."""
        return self.shape.num_chips * len(self.slice_names)

    def release(self) -> None:
        """Remove the placement groups (chips first, then head locks). Idempotent."""
        if self.handle is not None:
            self.handle.shutdown()
        if self.adopted_group is not None:
            _remove_quietly(self.adopted_group)
            self.adopted_group = None
        for pg in self.head_locks:
            _remove_quietly(pg)
        self.head_locks = []

    def __repr__(self) -> str:
        return (f"Reservation({self.name!r}, {self.shape.pod_type} {self.shape.topology}, "
                f"slices={self.slice_names}, hosts={self.num_hosts}, chips={self.num_chips})")


def reserve(
    shape: SliceShape,
    snapshot: Callable[[], ClusterSnapshot],
    *,
    name: str,
    num_slices: int = 1,
    timeout_s: float = 60.0,
    detached: bool = False,
    on_wait: Callable[[float], None] | None = None,
) -> Reservation:
    """Reserve ``num_slices`` whole slices of ``shape`` atomically.

    Args:
        shape: Generation and topology (already validated by :class:`SliceShape`).
        snapshot: Returns a fresh cluster snapshot (the session's single state reader).
        name: Reservation name; the placement group is named ``"raytpu:<name>"``.
        num_slices: Slices to hold together (multi-slice).
        timeout_s: Seconds to wait in all, across retries.
        detached: Keep the reservation when this driver exits (``lifetime="detached"``).
        on_wait: Called about every 0.5 s while waiting, with the seconds elapsed.

    Returns:
        The reservation, with every bundle placed.

    Raises:
        NoSliceAvailableError: The cluster has fewer intact slices of that pod type than asked
            (at once), or none became idle within ``timeout_s`` (names each slice and why).
    """
    start = time.monotonic()
    deadline = start + timeout_s
    lifetime = "detached" if detached else None
    snap = snapshot()
    intact = [s for s in snap.slices_of(shape.pod_type) if s.health == "intact"]
    if len(intact) < num_slices:
        raise diagnose(snap, shape, num_slices, timeout_s=0.0, impossible=True)
    while True:
        idle = [s.name for s in snap.idle_slices(shape.pod_type)]
        # A random pick: drivers racing from the same snapshot rarely all go for one slice.
        chosen = random.sample(idle, num_slices) if len(idle) >= num_slices else []
        if len(chosen) == num_slices:
            made = _try_reserve(shape, chosen, name, lifetime, deadline, start, on_wait)
            if made is not None:
                return Reservation(name=name, shape=shape, slice_names=chosen, handle=made[0],
                                   head_locks=made[1], detached=detached)
        if time.monotonic() >= deadline:
            raise diagnose(snapshot(), shape, num_slices, timeout_s=timeout_s)
        _tick(on_wait, start)
        time.sleep(random.uniform(0.1, 0.4))
        snap = snapshot()


def reserve_slices(shape: SliceShape, slice_names: list[str], *, name: str, timeout_s: float,
                   detached: bool = False) -> Reservation | None:
    """Reserve exactly ``slice_names`` (head locks, then the pinned slice placement group).

    Used to take back a reservation's own slices (e.g. after a training run used them).

    Returns:
        The reservation, or ``None`` (with nothing left behind) if they were not all free within
        ``timeout_s`` seconds.
    """
    start = time.monotonic()
    while True:
        made = _try_reserve(shape, list(slice_names), name, "detached" if detached else None,
                            start + timeout_s, start, None)
        if made is not None:
            break
        if time.monotonic() >= start + timeout_s:
            return None
        time.sleep(0.2)
    return Reservation(name=name, shape=shape, slice_names=list(slice_names), handle=made[0],
                       head_locks=made[1], detached=detached)


def lend_chips(res: Reservation) -> None:
    """Give up the chips of ``res`` (its slice placement group) and keep its head locks, so the
    slices stay out of every other reservation and run while something of this session (a Serve
    deployment pinned to the slices) takes the chips. Idempotent; :func:`retake_chips` undoes it."""
    if res.handle is not None:
        res.handle.shutdown()
        res.handle = None
    if res.adopted_group is not None:
        _remove_quietly(res.adopted_group)
        res.adopted_group = None


def retake_chips(res: Reservation, *, timeout_s: float = 30.0) -> bool:
    """Hold the chips of ``res`` again after :func:`lend_chips` (its head locks still held): one
    ``slice_placement_group`` pinned to its slices by ``ray.io/tpu-slice-name`` (Ray then skips
    its own head reservation).

    Returns:
        Whether every bundle was placed within ``timeout_s`` seconds (if not, nothing is left
        behind and ``res`` holds only its head locks).
    """
    if res.handle is not None or res.adopted_group is not None:
        return True
    shape, lifetime = res.shape, "detached" if res.detached else None
    start = time.monotonic()
    while True:
        handle = slice_placement_group(
            shape.topology, shape.version, num_slices=len(res.slice_names),
            bundle_label_selector=[{LABEL_SLICE: s} for s in res.slice_names
                                   for _ in range(shape.num_hosts)],
            name=reservation_group_name(res.name), lifetime=lifetime)
        pg = handle.placement_group
        if pg is not None and _wait_ready([pg], min(start + timeout_s, time.monotonic() + 5.0),
                                          start, None):
            res.handle = handle
            return True
        handle.shutdown()
        if time.monotonic() >= start + timeout_s:
            return False
        time.sleep(0.2)


def adopt(info: ReservationInfo, shape: SliceShape) -> Reservation:
    """Take over a reservation another driver made (e.g. a detached one from another kernel).

    The placement groups are addressed by id (``ray.util.placement_group.PlacementGroup``), so
    the Ray namespace the other driver used does not matter. Releasing the result removes them.
    """
    def group(pg_id: str) -> PlacementGroup:
        return PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg_id)))

    return Reservation(name=info.name, shape=shape, slice_names=list(info.slice_names), handle=None,
                       head_locks=[group(i) for i in info.head_locks.values()],
                       detached=bool(info.detached), adopted_group=group(info.placement_group_id))


def _try_reserve(shape: SliceShape, slices: list[str], name: str, lifetime: str | None,
                 deadline: float, start: float, on_wait: Callable[[float], None] | None,
                 ) -> tuple[SlicePlacementGroup, list[PlacementGroup]] | None:
    """Head locks, then the pinned slice placement group; ``None`` (all removed) if not in time."""
    locks: list[PlacementGroup] = []
    handle: SlicePlacementGroup | None = None
    made = False
    try:
        for s in slices:
            locks.append(placement_group(
                bundles=[{shape.head_resource: 1}],
                bundle_label_selector=[{LABEL_SLICE: s, LABEL_WORKER: "0"}],
                name=head_lock_name(name, s), lifetime=lifetime))
        # A head lock not placed at once means another driver locked that head after our
        # snapshot: give up on this pick soon and choose again, rather than wait out the timeout.
        if not _wait_ready(locks, min(deadline, time.monotonic() + _HEAD_ATTEMPT_S), start, on_wait):
            return None
        handle = slice_placement_group(
            shape.topology, shape.version, num_slices=len(slices),
            bundle_label_selector=[{LABEL_SLICE: s} for s in slices for _ in range(shape.num_hosts)],
            name=reservation_group_name(name), lifetime=lifetime)
        pg = handle.placement_group
        made = pg is not None and _wait_ready(
            [pg], min(deadline, time.monotonic() + _CHIPS_ATTEMPT_S), start, on_wait)
        return (handle, locks) if made else None
    finally:
        # Anything not returned above is half made: remove it before retrying or raising.
        if not made:
            if handle is not None:
                handle.shutdown()
            for pg in locks:
                _remove_quietly(pg)


def _wait_ready(pgs: list[PlacementGroup], deadline: float, start: float,
                on_wait: Callable[[float], None] | None) -> bool:
    refs = [pg.ready() for pg in pgs]
    while True:
        remaining = deadline - time.monotonic()
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=max(0.0, min(0.5, remaining)))
        if len(ready) == len(refs):
            return True
        if remaining <= 0:
            return False
        _tick(on_wait, start)


def _tick(on_wait: Callable[[float], None] | None, start: float) -> None:
    if on_wait is not None:
        on_wait(time.monotonic() - start)


def _remove_quietly(pg: PlacementGroup) -> None:
    try:
        remove_placement_group(pg)
    except Exception:  # already removed, or the cluster is gone: nothing left to free
        pass


def diagnose(snap: ClusterSnapshot, shape: SliceShape, num_slices: int, *, timeout_s: float,
             impossible: bool = False, wait_option: str = "timeout") -> NoSliceAvailableError:
    """Explain why ``num_slices`` slices of ``shape`` cannot be reserved, slice by slice.

    Args:
        snap: The snapshot to explain from.
        shape: The requested generation and topology.
        num_slices: Slices requested.
        timeout_s: How long was waited (0 when the request could never succeed).
        impossible: The cluster has too few intact slices of that pod type at all.
        wait_option: The option that sets the wait, named in the advice (a neutral name of
            :data:`raytpu_lab.advice.OPTIONS`: ``"timeout"`` for reserve, ``"wait"`` for a run).

    Returns:
        The error to raise (not raised here, so callers can add context).
    """
    reasons: dict[str, str] = {}
    for s in snap.slices_of(shape.pod_type):
        if s.health != "intact":
            reasons[s.name] = "degraded: " + "; ".join(s.reasons)
        elif s.owners:
            reasons[s.name] = "held by " + ", ".join(s.owners)
        elif s.chips_busy:
            reasons[s.name] = f"{s.chips_busy} of {s.chips_total} chips busy"
        elif s.head_locked:
            reasons[s.name] = "head (worker 0) locked by another placement group"
        else:
            reasons[s.name] = "idle"
    idle = sum(1 for r in reasons.values() if r == "idle")
    lines = "\n".join(f"  - {n}: {r}" for n, r in reasons.items()) or "  (none)"
    if impossible:
        what = (f"Cannot reserve {num_slices} slice(s) of {shape.pod_type} ({shape.topology}): the "
                f"cluster has {sum(1 for s in snap.slices_of(shape.pod_type) if s.health == 'intact')} "
                f"intact slice(s) of that pod type.")
        fix: Text = ("Ask for fewer slices, another topology, or start a bigger cluster (",
                     cmd("down"), ", then ",
                     cmd("up", tpu=f"{shape.version}:{shape.topology}", slices=num_slices), ").")
    else:
        what = (f"No {num_slices} idle slice(s) of {shape.pod_type} ({shape.topology}) became free "
                f"within {timeout_s:.0f} s; {idle} intact idle slice(s) now.")
        fix = ("Release a reservation (", cmd("reservations"), ", ", cmd("release", "NAME"),
               "), wait for runs to end, or raise ", opt(wait_option), ".")
    return NoSliceAvailableError(
        what, why="Slices of that pod type:\n" + lines, fix=fix, pod_type=shape.pod_type,
        timeout_s=timeout_s, slices_needed=num_slices, slices_idle=idle, reasons=reasons)
