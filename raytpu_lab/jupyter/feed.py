"""One cluster's sidebar state: raw Ray state in, revisions of what changed out.

:class:`ClusterFeed` turns each poll (the poller process's ``state`` line: raw state, placement
group lifetimes, the run board) into the same :class:`~raytpu_lab.state.snapshot.ClusterSnapshot`
the widget draws (:func:`raytpu_lab.state.model.build_snapshot`), then into the sidebar's panels
(summary, slice rows, reservations, runs, idle meter, what fits) and the map's own messages
(:class:`~raytpu_lab.jupyter.map_stream.MapStream`). Each poll that changed anything becomes one
revision holding only what changed (changed slice rows by index; a panel only when it changed; the
map's ``delta``); a client that is behind gets the revisions it missed, or one full state when it
is too far behind (more than :data:`KEEP_REVISIONS`).

Wire shapes (JSON):

- full: ``{"type": "full", "rev", "fetched_at", "geometry", "map": FullMessage, "summary",
  "slices": [SliceRow...], "reservations", "runs", "idle", "fits", "error"}``
- update: ``{"type": "update", "rev", "base", "fetched_at", "map": [map messages],
  "geometry"?, "slices": [[index, SliceRow]...] | {"all": [...]}, "summary"?, ...}``

A slice row is ``{"name", "pod_type", "topology", "hosts_alive", "hosts_expected", "state",
"health", "holders", "chips", "chips_free"}``. No Ray import: tests feed it recorded or synthetic
raw states.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Mapping
from typing import Any

from raytpu_lab.jupyter.map_stream import MapStream
from raytpu_lab.reservations.info import ReservationInfo, list_reservations
from raytpu_lab.state import usage
from raytpu_lab.state.model import build_snapshot
from raytpu_lab.state.snapshot import ClusterSnapshot, SliceState

__all__ = ["ClusterFeed", "KEEP_REVISIONS", "slice_row"]

KEEP_REVISIONS = 64
_PANELS = ("summary", "reservations", "runs", "idle", "fits", "error")


def slice_row(s: SliceState) -> dict[str, Any]:
    """The slice list's row of one slice (see the module docstring)."""
    return {"name": s.name, "pod_type": s.pod_type, "topology": s.topology,
            "hosts_alive": s.hosts_alive, "hosts_expected": s.hosts_expected, "state": s.state,
            "health": s.health, "holders": list(s.owners), "chips": s.chips_expected,
            "chips_free": s.chips_free}


def _summary(snap: ClusterSnapshot) -> dict[str, Any]:
    counts = collections.Counter(s.state for s in snap.slices)
    return {"slices": len(snap.slices), "by_state": dict(sorted(counts.items())),
            "hosts_alive": sum(s.hosts_alive for s in snap.slices),
            "hosts_expected": sum(s.hosts_expected for s in snap.slices),
            "chips_total": snap.total_chips, "chips_free": snap.free_chips,
            "other_nodes": len(snap.other_nodes), "pending": list(snap.pending_owners)}


def _owner(r: ReservationInfo) -> str:
    job = r.creator_job_id or "?"
    return f"job {job}" + (" (detached)" if r.detached else "")


class ClusterFeed:
    """Revisions of one cluster's sidebar state (see the module docstring).

    Args:
        expected_hosts: ``{slice name: hosts}`` when known (the emulator's record).
        idle_after_s: A reservation idle this long gets a nudge (seconds; default 15 minutes).
    """

    def __init__(self, expected_hosts: Mapping[str, int] | None = None, *,
                 idle_after_s: float = 900.0) -> None:
        self.expected_hosts = dict(expected_hosts or {})
        self.idle_after_s = idle_after_s
        self.rev = 0
        self.polls = 0
        self.snapshot: ClusterSnapshot | None = None
        self._map = MapStream()
        self._rows: list[dict[str, Any]] = []
        self._panels: dict[str, Any] = {p: None for p in _PANELS}
        self._fetched_at = 0.0
        self._log: collections.deque[dict[str, Any]] = collections.deque(maxlen=KEEP_REVISIONS)
        self._first_seen: dict[str, float] = {}
        self._meter = usage.IdleMeter()

    # -- input ---------------------------------------------------------------------------------

    def apply(self, raw: Mapping[str, Any], lifetimes: Mapping[str, Any] | None = None,
              runs: list[dict[str, Any]] | None = None, *, now: float | None = None,
              ) -> dict[str, Any] | None:
        """Take one poll; return the new revision, or ``None`` if nothing changed.

        Args:
            raw: Raw state (:class:`~raytpu_lab._protocols.RawState`'s shape).
            lifetimes: ``{placement group id: {"is_detached", "creator_job_id"}}``.
            runs: The run board's entries (:class:`~raytpu_lab.train.board.RunEntry`).
            now: Seconds since the epoch (tests pass their own clock).
        """
        now = time.time() if now is None else now
        self.polls += 1
        runs = list(runs or [])
        snap = build_snapshot(raw, expected_hosts=self.expected_hosts)  # type: ignore[arg-type]
        self.snapshot = snap
        self._fetched_at = snap.fetched_at
        reservations = list_reservations(raw, lifetimes or {})
        for r in reservations:
            self._first_seen.setdefault(r.name, now)
        for gone in set(self._first_seen) - {r.name for r in reservations}:
            del self._first_seen[gone]
        self._meter.observe(snap, reservations, runs, now)
        panels = {
            "summary": _summary(snap),
            "reservations": [{"name": r.name, "owner": _owner(r), "since": self._first_seen[r.name],
                              "chips": r.chips, "slices": r.slice_names, "state": r.state,
                              "pod_type": r.pod_type, "topology": r.topology}
                             for r in reservations],
            "runs": [{k: v for k, v in e.items() if k != "updated_at"} for e in runs],
            "idle": self._meter.view(now, self.idle_after_s),
            "fits": usage.what_fits(snap),
            "error": "",
        }
        return self._commit(snap, panels)

    def fail(self, error: str) -> dict[str, Any] | None:
        """A poll failed: show ``error`` (the rest stays as last seen)."""
        self.polls += 1
        if self._panels["error"] == error:
            return None
        self._panels["error"] = error
        self.rev += 1
        update = {"type": "update", "rev": self.rev, "base": self.rev - 1,
                  "fetched_at": self._fetched_at, "map": [], "error": error}
        self._log.append(update)
        return update

    def _commit(self, snap: ClusterSnapshot, panels: dict[str, Any]) -> dict[str, Any] | None:
        geometry_before = self._map.geometry.get("rev")
        map_msgs = self._map.draw(snap)
        rows = [slice_row(s) for s in snap.slices]
        update: dict[str, Any] = {}
        if map_msgs:
            update["map"] = map_msgs
        if self._map.geometry.get("rev") != geometry_before:
            update["geometry"] = self._map.geometry_now()
        if len(rows) != len(self._rows):
            update["slices"] = {"all": rows}
        else:
            changed = [[i, r] for i, (o, r) in enumerate(zip(self._rows, rows, strict=True)) if o != r]
            if changed:
                update["slices"] = changed
        self._rows = rows
        for name, value in panels.items():
            if value != self._panels[name]:
                update[name] = value
                self._panels[name] = value
        if not update:
            return None
        self.rev += 1
        update = {"type": "update", "rev": self.rev, "base": self.rev - 1,
                  "fetched_at": self._fetched_at, "map": [], **update}
        self._log.append(update)
        return update

    # -- output --------------------------------------------------------------------------------

    def full(self) -> dict[str, Any]:
        """Everything now, at revision :attr:`rev`."""
        return {"type": "full", "rev": self.rev, "fetched_at": self._fetched_at,
                "geometry": self._map.geometry_now(), "map": self._map.full(),
                "slices": list(self._rows), **self._panels}

    def since(self, rev: int) -> dict[str, Any]:
        """What a client at revision ``rev`` needs: ``{"type": "updates", "rev", "updates": [...]}``
        (empty when it is current), or :meth:`full` when ``rev`` is unknown or too old."""
        if rev == self.rev:
            return {"type": "updates", "rev": self.rev, "updates": []}
        if 0 <= rev < self.rev and self._log and self._log[0]["base"] <= rev:
            return {"type": "updates", "rev": self.rev,
                    "updates": [u for u in self._log if u["rev"] > rev]}
        return self.full()

    def details(self, slice_name: str, worker: int) -> dict[str, Any]:
        """Hover/click details of one host (the map's ``details`` message)."""
        return dict(self._map.details(slice_name, worker))
