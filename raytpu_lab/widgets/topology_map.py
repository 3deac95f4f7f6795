"""The live topology map: an anywidget drawing each slice as its host grid, updated by deltas.

Sync protocol (Python -> front end), chosen so a refresh of a 4,096-host pod sends a few KB: the
``geometry`` trait (changes only when the set of slices or their shapes changes), a ``full``
message with every host (sent when a view asks, ``{"type": "request_full"}``, which each view does
on render, and after every re-layout), a ``delta`` message with only what changed (nothing at all
when nothing changed; a view whose ``rev`` is not the delta's ``base`` asks for a full state), and
``details`` answers to a view's hover (labels are large and rarely looked at, so they are never
part of full or delta messages). Every field of these is declared once, with the JS's names for
the positional host rows, in :mod:`raytpu_lab._protocols` (its "Topology map wire protocol").

Other traits: ``dcn`` (list of multi-slice groups, each the slice names of one run in
``MEGASCALE_SLICE_ID`` order; the view joins consecutive slices of a group with a dashed link
badged "DCN", ``.dcn-link[data-from][data-to]``), ``highlight`` (list of slice names), ``status``
(text for the status line) and ``selected`` (set by the view, :class:`~raytpu_lab._protocols.Selected`).

Trait changes of one :meth:`TopologyMap.update` are batched with ``hold_sync()``; :meth:`update`
is safe to call from a refresher thread. The display also carries ``text/plain``
(:func:`~raytpu_lab.widgets.svg.render_status_text`) and ``text/html`` (the status table and the
static SVG map as an ``<img>``, :func:`~raytpu_lab.widgets.svg.render_status_html`) for front
ends without a widget manager; JupyterLab shows that in an untrusted notebook (its widget
renderer is for trusted outputs only, and its sanitizer keeps the ``<img>``).
"""

from __future__ import annotations

import pathlib
import threading
from collections.abc import Iterable, Mapping
from typing import Any, TypeAlias

import anywidget
import ipywidgets
import traitlets

from raytpu_lab._protocols import (
    DeltaMessage,
    DetailsMessage,
    FullMessage,
    Geometry,
    HostChange,
    HostRow,
    NodeChange,
    NodeRow,
    SliceChange,
    SliceGeometry,
    SliceRow,
)
from raytpu_lab.state.snapshot import HOST_STATES, ClusterSnapshot, SliceState
from raytpu_lab.widgets.svg import (
    MAX_HOSTS_WITH_CHIPS,
    STATE_COLORS,
    render_status_html,
    render_status_text,
    slice_title,
)

__all__ = ["TopologyMap", "SUMMARY_HOSTS"]

SUMMARY_HOSTS = 256
"""Above this many hosts in total, the view draws one summary tile per slice (click expands)."""

_CODE = {state: i for i, state in enumerate(HOST_STATES)}
_GeometryKey: TypeAlias = tuple[tuple[str, str, str, int, int], ...]


def _geometry_key(snapshot: ClusterSnapshot) -> _GeometryKey:
    return tuple((s.name, s.version, s.topology, s.shape.chips_per_host, len(s.hosts))
                 for s in snapshot.slices)


def _slice_geometry(s: SliceState) -> SliceGeometry:
    shape = s.shape
    return SliceGeometry(name=s.name, pod_type=s.pod_type, topology=s.topology,
                         ndims=len(shape.dims), dims=list(shape.dims), grid=list(shape.host_grid),
                         block=list(shape.chips_per_host_bounds), wrap=list(shape.wraparound),
                         hosts=len(s.hosts), known=s.shape_known)


def _rows(snapshot: ClusterSnapshot
          ) -> tuple[list[SliceRow], list[list[HostRow]], list[list[NodeRow]]]:
    slices: list[SliceRow] = []
    hosts: list[list[HostRow]] = []
    nodes: list[list[NodeRow]] = []
    code = _CODE
    for s in snapshot.slices:
        slices.append((slice_title(s), s.state, "; ".join(s.reasons)))
        # Per-chip holders only where the view draws chips: a row stays five numbers and a
        # name for each host of a 4,096-host pod.
        chips = len(s.hosts) <= MAX_HOSTS_WITH_CHIPS
        hosts.append([(code.get(h.state, 0), h.chips_free, h.chips_reserved, h.chips_busy,
                       h.owner, h.chip_layout if chips else "",
                       list(h.chip_holders) if chips else []) for h in s.hosts])
        nodes.append([(h.node_id, h.ip) for h in s.hosts])
    return slices, hosts, nodes


def _host_changes(si: int, old: list[HostRow], new: list[HostRow]) -> list[HostChange]:
    return [(si, w, *n) for w, (o, n) in enumerate(zip(old, new, strict=True)) if o != n]


def _node_changes(si: int, old: list[NodeRow], new: list[NodeRow]) -> list[NodeChange]:
    return [(si, w, *n) for w, (o, n) in enumerate(zip(old, new, strict=True)) if o != n]


class TopologyMap(anywidget.AnyWidget):
    """Live map of a cluster's TPU slices, hosts and chips.

    Args:
        snapshot: The first state to draw; ``None`` draws an empty map until :meth:`update`.
        highlight: Slice names to ring (e.g. a reservation's slices).

    Example::

        m = TopologyMap(lab.snapshot(), highlight=["tpu-v6e-4x4-0"])
        display(m)
        m.update(lab.snapshot())   # sends only what changed
        m.selected                 # {"slice": ..., "worker": 2, "node_id": ...} after a click
    """

    # The module's text, not its path: anywidget watches a path-valued _esm through a signal that
    # holds every instance strongly, so no map would ever be garbage-collected.
    _esm = pathlib.Path(__file__).with_name("topology_map.js").read_text(encoding="utf-8")

    geometry = traitlets.Dict().tag(sync=True)
    highlight = traitlets.List(traitlets.Unicode()).tag(sync=True)
    dcn = traitlets.List(traitlets.List(traitlets.Unicode())).tag(sync=True)
    status = traitlets.Unicode("").tag(sync=True)
    selected = traitlets.Dict().tag(sync=True)

    def __init__(self, snapshot: ClusterSnapshot | None = None, *,
                 highlight: Iterable[str] = ()) -> None:
        super().__init__()
        self._lock = threading.RLock()
        self._snapshot: ClusterSnapshot | None = None
        self._key: _GeometryKey | None = None
        self._slices: list[SliceRow] = []
        self._hosts: list[list[HostRow]] = []
        self._nodes: list[list[NodeRow]] = []
        self._extra: tuple[int, tuple[str, ...]] = (0, ())
        self._rev = 0
        self._geometry_rev = 0
        self.highlight = sorted(set(highlight))
        self.on_msg(self._on_view_msg)
        self.update(snapshot or ClusterSnapshot(0.0, [], [], None))

    # --- public API ------------------------------------------------------------------------------

    @property
    def snapshot(self) -> ClusterSnapshot | None:
        """The last snapshot drawn."""
        return self._snapshot

    @property
    def closed(self) -> bool:
        """:meth:`close` was called (the refresher drops closed views)."""
        return self.comm is None

    def update(self, snapshot: ClusterSnapshot) -> None:
        """Draw a new snapshot, sending only what changed since the last one.

        A change in the set of slices (or a slice's shape / host count) re-lays out the map and
        sends a full state; otherwise at most one ``delta`` message goes out, none when nothing
        changed.

        Args:
            snapshot: The cluster now.
        """
        if self.closed:
            return
        with self._lock:
            key = _geometry_key(snapshot)
            slices, hosts, nodes = _rows(snapshot)
            extra = (len(snapshot.other_nodes), tuple(snapshot.pending_owners))
            self._snapshot = snapshot
            if key != self._key:
                self._key = key
                self._slices, self._hosts, self._nodes, self._extra = slices, hosts, nodes, extra
                self._geometry_rev += 1
                self._rev += 1
                with self.hold_sync():
                    self.geometry = dict(self._geometry_dict(snapshot))
                self.send(self._full_message())  # after the geometry: views draw it first
                return
            delta = self._delta(slices, hosts, nodes, extra)
            if delta is not None:
                self.send(delta)

    def set_highlight(self, names: Iterable[str]) -> None:
        """Ring these slices (replacing the previous set)."""
        self.highlight = sorted(set(names))

    def set_dcn(self, groups: Iterable[Iterable[str]]) -> None:
        """Mark multi-slice groups (each: one run's slices in ``MEGASCALE_SLICE_ID`` order) with a
        "DCN" link between consecutive slices (replacing the previous groups); ``[]`` clears."""
        lists = [list(g) for g in groups]
        self.dcn = [g for g in lists if len(g) > 1]

    def set_status(self, text: str) -> None:
        """Show ``text`` in the view's status line, e.g. ``"disconnected — retrying"``."""
        self.status = str(text)

    def close(self) -> None:
        """Close the widget and the ``Layout`` widget ipywidgets gave it, freeing both comms.

        ``DOMWidget.close`` leaves its ``layout`` child open, so every map shown and closed would
        otherwise leave one widget behind in ``ipywidgets.Widget.widgets``.
        """
        layout = self.layout
        super().close()
        if isinstance(layout, ipywidgets.Widget):
            layout.close()

    # --- messages --------------------------------------------------------------------------------

    def _geometry_dict(self, snapshot: ClusterSnapshot) -> Geometry:
        return Geometry(rev=self._geometry_rev, states=list(HOST_STATES),
                        colors=dict(STATE_COLORS), summary_hosts=SUMMARY_HOSTS,
                        chips_hosts=MAX_HOSTS_WITH_CHIPS,
                        slices=[_slice_geometry(s) for s in snapshot.slices])

    def _full_message(self) -> FullMessage:
        # Rows are tuples; the comm's JSON sends them as the arrays the view destructures.
        with self._lock:
            return FullMessage(type="full", geometry_rev=self._geometry_rev, rev=self._rev,
                               slices=list(self._slices),
                               hosts=[list(rows) for rows in self._hosts],
                               nodes=[list(rows) for rows in self._nodes],
                               other=self._extra[0], pending=list(self._extra[1]))

    def _delta(self, slices: list[SliceRow], hosts: list[list[HostRow]],
               nodes: list[list[NodeRow]], extra: tuple[int, tuple[str, ...]]
               ) -> DeltaMessage | None:
        s_changes: list[SliceChange] = [
            (i, *new) for i, (old, new) in enumerate(zip(self._slices, slices, strict=True))
            if old != new]
        h_changes: list[HostChange] = []
        n_changes: list[NodeChange] = []
        for i in range(len(hosts)):
            if self._hosts[i] != hosts[i]:  # list equality in C: unchanged slices cost ~nothing
                h_changes.extend(_host_changes(i, self._hosts[i], hosts[i]))
            if self._nodes[i] != nodes[i]:
                n_changes.extend(_node_changes(i, self._nodes[i], nodes[i]))
        self._slices, self._hosts, self._nodes = slices, hosts, nodes
        if not (s_changes or h_changes or n_changes or extra != self._extra):
            return None
        self._extra = extra
        self._rev += 1
        return DeltaMessage(type="delta", geometry_rev=self._geometry_rev, base=self._rev - 1,
                            rev=self._rev, s=s_changes, h=h_changes, n=n_changes,
                            other=extra[0], pending=list(extra[1]))

    def _details(self, slice_name: str, worker: int) -> DetailsMessage:
        out = DetailsMessage(type="details", slice=slice_name, worker=worker)
        snap = self._snapshot
        try:
            host = snap.slice(slice_name).hosts[worker] if snap else None
        except (KeyError, IndexError):
            host = None
        if host is not None:
            out["node_id"], out["ip"], out["owner"] = host.node_id, host.ip, host.owner
            out["labels"] = dict(host.labels)
        return out

    def _on_view_msg(self, _widget: object, content: object, _buffers: object) -> None:
        """Answer a :data:`~raytpu_lab._protocols.ViewMessage`; anything else is ignored."""
        if not isinstance(content, Mapping):
            return
        kind = content.get("type")
        if kind == "request_full":
            self.send(self._full_message())
        elif kind == "details":
            try:
                worker = int(content.get("worker", -1))
            except (TypeError, ValueError):
                return
            self.send(self._details(str(content.get("slice", "")), worker))

    # --- display ---------------------------------------------------------------------------------

    def static_bundle(self) -> dict[str, str]:
        """The map's last snapshot without the widget: ``text/plain`` (status table) and
        ``text/html`` (static SVG map), what a frozen view of it is replaced by."""
        snap = self._snapshot or ClusterSnapshot(0.0, [], [], None)
        return {"text/plain": render_status_text(snap),
                "text/html": render_status_html(snap, self.highlight, dcn=self.dcn)}

    def _repr_mimebundle_(self, **kwargs: Any) -> tuple[dict[str, object], dict[str, object]]:
        """The widget view plus ``text/plain`` (status table) and ``text/html`` (static SVG map).

        ipywidgets / anywidget put only the widget-view reference and a one-line repr in the
        bundle; a front end without the widget manager then shows "Error displaying widget" or
        that repr. Here the static rendering of the last snapshot rides along, so nbviewer,
        GitHub, VS Code offline and exports still show a readable map.
        """
        bundle = super()._repr_mimebundle_(**kwargs)
        data, metadata = bundle if isinstance(bundle, tuple) else (bundle or {}, {})
        data = {**data, **self.static_bundle()}
        return data, metadata
