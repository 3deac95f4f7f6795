"""The topology map's own delta encoding, run in the Jupyter server for the sidebar.

:class:`MapStream` is :class:`~raytpu_lab.widgets.topology_map.TopologyMap` with its comm replaced
by a list: the same ``geometry`` / ``full`` / ``delta`` messages (:mod:`raytpu_lab._protocols`'s
"Topology map wire protocol") the widget sends to a kernel's view, here collected so the server
can hand them to the sidebar's views, which draw them with the same JS module
(``raytpu_lab/widgets/topology_map.js``). Outside a kernel ipywidgets gives the widget a
``DummyComm``, so nothing is opened or sent anywhere.
"""

from __future__ import annotations

from typing import Any

from raytpu_lab._protocols import DetailsMessage, FullMessage, Geometry
from raytpu_lab.state.snapshot import ClusterSnapshot
from raytpu_lab.widgets.topology_map import TopologyMap

__all__ = ["MapStream"]


class MapStream(TopologyMap):
    """A map with no view: :meth:`take` returns the messages :meth:`update` produced."""

    def __init__(self) -> None:
        self._out: list[dict[str, Any]] = []
        super().__init__()
        self._out.clear()

    def send(self, content: Any, buffers: Any = None) -> None:
        """Collect instead of sending over a comm."""
        self._out.append(dict(content))

    def take(self) -> list[dict[str, Any]]:
        """The messages since the last call (a ``full`` after a re-layout, else at most one
        ``delta``), oldest first."""
        out, self._out = self._out, []
        return out

    def full(self) -> FullMessage:
        """The whole map state now."""
        return self._full_message()

    def geometry_now(self) -> Geometry:
        """The ``geometry`` trait (slice shapes; changes only on re-layout)."""
        return dict(self.geometry)  # type: ignore[return-value]

    def details(self, slice_name: str, worker: int) -> DetailsMessage:
        """The hover details of one host (node id, IP, owner, labels)."""
        return self._details(slice_name, worker)

    def draw(self, snapshot: ClusterSnapshot) -> list[dict[str, Any]]:
        """:meth:`update` then :meth:`take`."""
        self.update(snapshot)
        return self.take()
