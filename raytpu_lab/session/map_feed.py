"""The map feed: the session's one refresher, its live topology map, the status view, and what
they highlight (this session's slices, a run's slices and DCN links, runs' labels)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from raytpu_lab.session.refresher import Refresher
from raytpu_lab.state.snapshot import ClusterSnapshot
from raytpu_lab.widgets.status import StatusView
from raytpu_lab.widgets.topology_map import TopologyMap

__all__ = ["MapFeed"]


class MapFeed:
    """Feeds snapshots to the live map and status views.

    Args:
        snapshot: Reads the cluster (the session's snapshot).
        own_slices: The slices to ring when no highlight is given (this session's reservations).

    Attributes:
        refresher: The one poller of the session; every live view it holds gets each snapshot.
        jobs: ``{placement group id: "run <name>"}`` of runs going on (``"serve: <app>"`` of
            Serve apps), shown as owners.
        serving: ``{"serve: <app>": slice names}`` of the Serve apps running.
    """

    def __init__(self, snapshot: Callable[[], ClusterSnapshot],
                 own_slices: Callable[[], set[str]] = set) -> None:
        self.snapshot = snapshot
        self.own_slices = own_slices
        self.refresher = Refresher(snapshot)
        self.jobs: dict[str, str] = {}
        self.serving: dict[str, list[str]] = {}
        self._map: TopologyMap | None = None
        self._shown: list[Any] = []

    def status(self, highlight: set[str] | None = None) -> StatusView:
        """A view of the snapshot: text table, HTML table and SVG map (for display); rings
        ``highlight`` (this session's slices if ``None``) here and on the live map.

        Raises:
            NotConnectedError: No cluster connected.
        """
        marked = highlight if highlight is not None else self.own_slices()
        snapshot = self.snapshot()
        self.highlight(marked)
        return StatusView(snapshot, highlight=marked)

    def map(self, *, highlight: set[str] | None = None, interval_s: float | None = None,
            ) -> TopologyMap:
        """The session's live topology map (one widget per session; displaying it again adds a view).

        Args:
            highlight: Slices to ring; this session's reservations if ``None``.
            interval_s: Seconds between refreshes (the session's one refresher; default 1 s).

        Raises:
            NotConnectedError: No cluster connected.
        """
        snapshot = self.snapshot()
        if interval_s is not None:
            self.refresher.interval_s = interval_s
        marked = highlight if highlight is not None else self.own_slices()
        if self._live() is None:
            self._map = TopologyMap(snapshot, highlight=marked)
        else:
            assert self._map is not None
            self._map.update(snapshot)
            self._map.set_highlight(marked)
        self.refresher.add(self._map)
        return self._map

    def highlight(self, slices: set[str]) -> None:
        """Ring ``slices`` on the live map (if one is shown) and refresh it now."""
        live = self._live()
        if live is not None:
            live.set_highlight(slices)
            self.refresher.refresh_now()

    def mark_dcn(self, groups: list[list[str]]) -> None:
        """Draw DCN links between the slices of each group on the live map (if one is shown)."""
        live = self._live()
        if live is not None:
            live.set_dcn(groups)

    def run_placed(self, label: str, slice_names: list[str], pg_ids: list[str],
                   num_slices: int) -> None:
        """A run's slices are known: its placement groups are shown as owned by ``label``
        (e.g. ``"run r1"``) and its slices ringed; a multi-slice run's slices are linked by DCN
        (both kept until the next run)."""
        self.jobs.update({pg: label for pg in pg_ids})
        self.highlight(set(slice_names))
        self.mark_dcn([slice_names] if num_slices > 1 else [])

    def serving_placed(self, label: str, slice_names: list[str], pg_ids: list[str]) -> None:
        """A Serve app runs on ``slice_names``: its replicas' placement groups are shown as owned
        by ``label`` (``"serve: <app>"``) and its slices ringed, until :meth:`run_ended`."""
        self.jobs.update({pg: label for pg in pg_ids})
        self.serving[label] = list(slice_names)
        self.highlight(set(slice_names) | self.own_slices())

    def run_ended(self, label: str) -> None:
        """The run ``label`` ended: its placement groups are no longer shown as its."""
        self.jobs = {pg: v for pg, v in self.jobs.items() if v != label}
        self.serving.pop(label, None)

    def shown(self, handle: Any) -> None:
        """Remember a displayed view of the map (an IPython ``DisplayHandle``): :meth:`stop`
        replaces it by the map's static copy, so a saved notebook holds no dead widget."""
        self._shown.append(handle)

    def stop(self, status: str) -> None:
        """Stop refreshing; the map (if any) shows ``status``, e.g. "disconnected", and every
        view of it registered with :meth:`shown` becomes its static copy (last snapshot)."""
        self.refresher.stop()
        if self._map is not None:
            self._map.set_status(status)
            shown, self._shown = self._shown, []
            for handle in shown:
                try:
                    handle.update(self._map.static_bundle(), raw=True)
                except Exception:  # a display that is gone (another kernel's front end)
                    pass

    def _live(self) -> TopologyMap | None:
        if self._map is None or getattr(self._map, "closed", False):
            return None
        return self._map
