"""Idle meter and "what fits now": pure functions over snapshots, for the Lab sidebar.

**Idle meter** (:class:`IdleMeter`): fed one snapshot per poll, it integrates per reservation and
per slice the chip-hours *held* (chips a reservation or run holds, times the seconds between
polls) and the chip-hours *idle* (held while nothing uses them: no run of the run board on the
reservation's slices and no chip of its hosts busy), plus the current idle streak; a reservation
idle longer than a setting (default 15 minutes) is flagged ``nudge``. It counts from the first
poll that saw a reservation (Ray's placement-group table has no creation time). Per-host session
activity (a ``SliceSession`` running code) shows here only through busy chips; a session that
holds no chip of its own looks idle.

**What fits now** (:func:`what_fits`): for each topology valid for the cluster's generations
(``tpu.generations.valid_topologies``) up to the generation's total chips, how many slices a slice
reservation could take right now (an intact slice of exactly that topology with every chip free
and its head not locked, as ``ray.util.tpu.slice_placement_group`` needs) and, when none, why:
held by whom, degraded, partly used, or no slice of that topology.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from raytpu_lab.reservations.info import ReservationInfo
from raytpu_lab.state.snapshot import ClusterSnapshot
from raytpu_lab.tpu.generations import valid_topologies

__all__ = ["IdleMeter", "Usage", "what_fits", "IDLE_AFTER_S", "MAX_GAP_S"]

IDLE_AFTER_S = 900.0
"""A reservation idle this long (seconds) gets a nudge: 15 minutes."""
MAX_GAP_S = 60.0
"""A gap between polls longer than this (seconds) counts as this long (the server slept)."""
_HOUR_S = 3600.0


@dataclass
class Usage:
    """Chip-hours of one reservation or slice.

    Attributes:
        chips: Chips held at the last poll.
        held_chip_h: Chip-hours held since first seen.
        idle_chip_h: Of those, chip-hours held with nothing using them.
        idle_s: Seconds of the current idle streak (0 while in use).
        first_seen: Seconds since the epoch of the first poll that saw it.
    """

    chips: int = 0
    held_chip_h: float = 0.0
    idle_chip_h: float = 0.0
    idle_s: float = 0.0
    first_seen: float = 0.0

    def add(self, chips: int, idle: bool, dt_s: float) -> None:
        """Count ``dt_s`` seconds of ``chips`` held (idle or not)."""
        self.chips = chips
        self.held_chip_h += chips * dt_s / _HOUR_S
        if idle:
            self.idle_chip_h += chips * dt_s / _HOUR_S
            self.idle_s += dt_s
        else:
            self.idle_s = 0.0


@dataclass
class IdleMeter:
    """Integrates chip-hours held and idle across polls (see the module docstring)."""

    reservations: dict[str, Usage] = field(default_factory=dict)
    slices: dict[str, Usage] = field(default_factory=dict)
    last: float | None = None

    def observe(self, snap: ClusterSnapshot, reservations: Sequence[ReservationInfo],
                runs: Iterable[Mapping[str, Any]], now: float) -> None:
        """Count the time since the previous poll with this poll's state.

        Args:
            snap: The cluster now.
            reservations: Every reservation on it (``reservations.info.list_reservations``).
            runs: The run board's entries; ``"running"``/``"stopping"`` ones use their slices.
            now: Seconds since the epoch.
        """
        dt = 0.0 if self.last is None else min(max(0.0, now - self.last), MAX_GAP_S)
        self.last = now
        used = {s for r in runs if r.get("state") in ("running", "stopping")
                for s in r.get("slices") or []}
        busy = {s.name for s in snap.slices if s.chips_busy > 0}
        seen = set()
        for r in reservations:
            seen.add(r.name)
            u = self.reservations.setdefault(r.name, Usage(first_seen=now))
            active = bool(set(r.slice_names) & (used | busy))
            u.add(r.chips, not active, dt)
        for name in set(self.reservations) - seen:
            del self.reservations[name]
        seen = set()
        for s in snap.slices:
            held = s.chips_reserved + s.chips_busy
            if held == 0 and s.name not in self.slices:
                continue
            seen.add(s.name)
            u = self.slices.setdefault(s.name, Usage(first_seen=now))
            u.add(held, s.name not in used and s.chips_busy == 0 and held > 0, dt)
        for name in set(self.slices) - seen:
            del self.slices[name]

    def view(self, now: float, idle_after_s: float = IDLE_AFTER_S) -> dict[str, Any]:
        """JSON-able: ``{"reservations": {name: {...Usage, "nudge"}}, "slices": {...},
        "total": {"held_chip_h", "idle_chip_h"}, "idle_after_s"}`` (chip-hours rounded to 0.01,
        so the view changes about once a minute per chip rather than every poll)."""
        def one(u: Usage, nudge: bool | None = None) -> dict[str, Any]:
            out: dict[str, Any] = {"chips": u.chips, "held_chip_h": round(u.held_chip_h, 2),
                                   "idle_chip_h": round(u.idle_chip_h, 2),
                                   "idle_min": int(u.idle_s // 60)}
            if nudge is not None:
                out["nudge"] = nudge
            return out
        res = {n: one(u, u.idle_s >= idle_after_s) for n, u in sorted(self.reservations.items())}
        sl = {n: one(u) for n, u in sorted(self.slices.items())}
        total = {"held_chip_h": round(sum(u.held_chip_h for u in self.slices.values()), 2),
                 "idle_chip_h": round(sum(u.idle_chip_h for u in self.slices.values()), 2)}
        return {"reservations": res, "slices": sl, "total": total, "idle_after_s": idle_after_s}


def what_fits(snap: ClusterSnapshot) -> list[dict[str, Any]]:
    """For each generation on the cluster and each valid topology up to its total chips: how many
    slice reservations would succeed now, and why not when none.

    Returns:
        ``[{"version", "topology", "chips", "fits": int, "slices": int, "why": str}]``, by
        generation then chip count; ``why`` is ``""`` when ``fits > 0``, e.g.
        ``"held by r1, r2; 1 degraded"`` or ``"no 4x8 slice (cluster has 4x4)"``.
    """
    out: list[dict[str, Any]] = []
    versions = sorted({s.version for s in snap.slices if s.version and s.shape_known})
    for version in versions:
        mine = [s for s in snap.slices if s.version == version]
        cap = sum(s.chips_expected for s in mine)
        have = sorted({s.topology for s in mine})
        try:
            topologies = valid_topologies(version)
        except (KeyError, ValueError):
            topologies = have
        for topology in topologies:
            same = [s for s in mine if s.topology == topology]
            chips = same[0].chips_expected if same else _chips(topology, version)
            if chips > cap and not same:
                continue
            fits = sum(1 for s in same if s.idle)
            out.append({"version": version, "topology": topology, "chips": chips, "fits": fits,
                        "slices": len(same), "why": "" if fits else _why_not(same, topology, have)})
    return out


def _chips(topology: str, version: str) -> int:
    n = 1
    for d in topology.split("x"):
        n *= int(d)
    return n


def _why_not(same: Sequence[Any], topology: str, have: list[str]) -> str:
    if not same:
        return f"no {topology} slice (cluster has {', '.join(have) or 'none'})"
    owners: Counter[str] = Counter()
    degraded = partial = 0
    for s in same:
        if s.state in ("degraded", "provisioning", "replacing"):
            degraded += 1
        elif s.owners:
            owners.update(s.owners)
        else:
            partial += 1
    parts = []
    if owners:
        parts.append("held by " + ", ".join(sorted(owners)))
    if degraded:
        parts.append(f"{degraded} degraded or not ready")
    if partial:
        parts.append(f"{partial} partly used (head locked or chips busy)")
    return "; ".join(parts)
