"""Which chip of a host is whose: Ray's chip ids, from the raylet, onto the host's chip counts.

Pure. :func:`raytpu_lab.state.fetch.fetch_raw_state` reads, per node with chips in use, the
worker processes holding ``TPU`` chips and their ids (:class:`~raytpu_lab._protocols
.RawChipHolder`); :func:`place_chips` lays them onto the counts :mod:`raytpu_lab.state.model`
derives from Ray's resources, so counts and ids never disagree:

- a chip a process holds is drawn at its id, ``"b"`` (busy) or, when the process runs in a
  reservation's placement group (not a run's), ``"r"`` (reserved);
- the bundles' chips no process uses yet have no id in Ray (a bundle holds an amount, not chips):
  they take the lowest ids left, then the busy chips Ray counts but no process listed, then free.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from raytpu_lab._protocols import RawChipHolder

__all__ = ["holder_label", "place_chips"]


def holder_label(holder: RawChipHolder, owners: Mapping[str, str]) -> str:
    """How a chip's holder is named on the map: ``"run digits: RayTrainWorker (job 02000000,
    pid 8090)"``, ``"Holder 'a' (job 01000000, pid 8091)"``, ``"task (job 01000000, pid 8092)"``.

    Args:
        holder: One worker process as the raylet lists it.
        owners: ``{placement group id: owner}`` (reservation, run or Serve app), as the map
            names a group's chips.
    """
    what = holder.get("class_name") or ("actor" if holder.get("actor_id") else "task")
    if holder.get("actor_name"):
        what += f" {holder['actor_name']!r}"
    job = str(holder.get("job_id", ""))
    who = f"{what} (job {job or '?'}, pid {holder.get('pid', '?')})"
    owner = owners.get(str(holder.get("placement_group_id") or ""))
    return f"{owner}: {who}" if owner else who


def place_chips(total: int, reserved: int, busy: int, holders: Iterable[RawChipHolder],
                owners: Mapping[str, str], jobs: frozenset[str]) -> tuple[str, tuple[str, ...]]:
    """``(layout, labels)``: each chip's state letter and holder, by Ray chip id.

    Args:
        total: The host's chips (its ``TPU`` total).
        reserved: Chips held by reservations' bundles (no run's).
        busy: Chips in use outside them (runs' bundles included).
        holders: The processes holding chips (ids ``>= total`` are ignored).
        owners: ``{placement group id: owner}``.
        jobs: Owners that are runs: their processes' chips are busy, not reserved.

    Returns:
        ``("", ())`` when no holder names a chip; else a ``total``-letter layout (``r``, ``b``,
        ``f``) with exactly ``reserved`` r's and ``busy`` b's, and ``total`` labels (``""``
        where nobody is known).
    """
    letters: list[str | None] = [None] * total
    labels = [""] * total
    left = {"r": reserved, "b": busy}
    for holder in holders:
        owner = owners.get(str(holder.get("placement_group_id") or ""))
        want = "r" if owner is not None and owner not in jobs else "b"
        label = holder_label(holder, owners)
        for chip in holder.get("chips") or []:
            if not 0 <= chip < total or letters[chip] is not None:
                continue
            # Ray's counts win: a holder seen a moment before its chips were counted keeps its
            # name but takes whatever state is left (the next refresh agrees).
            kind = want if left[want] else "b" if left["b"] else "r" if left["r"] else "f"
            if kind != "f":
                left[kind] -= 1
            letters[chip], labels[chip] = kind, label
    if all(letter is None for letter in letters):
        return "", ()
    rest = iter(["r"] * left["r"] + ["b"] * left["b"])
    layout = "".join(letter or next(rest, "f") for letter in letters)
    return layout, tuple(labels)
