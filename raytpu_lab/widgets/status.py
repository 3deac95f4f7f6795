"""A displayable status of the cluster: text table, HTML table and SVG map of one snapshot.

Pure: IPython finds :meth:`StatusView._repr_mimebundle_` by name, so no IPython import is needed,
and every front end (JupyterLab, VS Code, nbviewer, an HTML export) shows the static map.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from raytpu_lab.state.snapshot import ClusterSnapshot
from raytpu_lab.widgets.svg import render_status_html, render_status_text

__all__ = ["StatusView"]


class StatusView:
    """The cluster at one moment, for display.

    Args:
        snapshot: What to show.
        highlight: Slice names to ring on the map (e.g. this session's reservations).
    """

    def __init__(self, snapshot: ClusterSnapshot, highlight: Iterable[str] | None = None) -> None:
        self.snapshot = snapshot
        self.highlight = set(highlight or ())

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": render_status_text(self.snapshot),
                "text/html": render_status_html(self.snapshot, self.highlight)}

    def __repr__(self) -> str:
        return render_status_text(self.snapshot)
