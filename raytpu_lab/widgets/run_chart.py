"""Live loss and step-time chart of a training run (plotly), with a static HTML form for exports.

Pure of Ray: it draws the records a run streams (``{"report", "rank", "time_s", **metrics}``).
The live form is a plotly ``FigureWidget``; :meth:`RunChart.static_html` embeds plotly.js inline so
an exported notebook shows the chart without a kernel or internet.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

__all__ = ["RunChart"]


class RunChart:
    """Rank 0's ``loss`` and ``step_time_s`` against ``step`` (or the report index).

    Args:
        title: Chart title, e.g. the run name.
        live: Build a ``FigureWidget`` (needs a widget front end) rather than a plain figure.
    """

    def __init__(self, title: str, *, live: bool = True) -> None:
        base = make_subplots(rows=1, cols=2, subplot_titles=("loss", "step time (s)"))
        base.add_trace(go.Scatter(x=[], y=[], mode="lines+markers", name="loss"), row=1, col=1)
        base.add_trace(go.Scatter(x=[], y=[], mode="lines+markers", name="step_time_s"), row=1, col=2)
        base.update_layout(title=title, height=320, margin={"t": 60, "b": 40, "l": 50, "r": 20},
                           showlegend=False)
        base.update_xaxes(title_text="step")
        self.figure: go.Figure = go.FigureWidget(base) if live else base
        self._x: list[float] = []
        self._loss: list[float | None] = []
        self._step_time: list[float | None] = []
        self._lock = threading.Lock()

    def add(self, records: Iterable[dict[str, Any]]) -> None:
        """Append rank 0's records and redraw once (one batched update, however many records)."""
        with self._lock:
            for r in records:
                if r.get("rank") != 0:
                    continue
                self._x.append(r.get("step", r.get("report", len(self._x))))
                self._loss.append(r.get("loss"))
                self._step_time.append(r.get("step_time_s"))
            with self.figure.batch_update():
                self.figure.data[0].x, self.figure.data[0].y = list(self._x), list(self._loss)
                self.figure.data[1].x, self.figure.data[1].y = list(self._x), list(self._step_time)

    @property
    def has_data(self) -> bool:
        """Whether any rank-0 record arrived."""
        return bool(self._x)

    def static_html(self) -> str:
        """The chart as an HTML fragment with plotly.js inline (about 4.7 MB; no network needed)."""
        with self._lock:
            fig = go.Figure(self.figure)
        return fig.to_html(include_plotlyjs=True, full_html=False)
