"""The live metrics chart of a run: an anywidget drawing SVG lines in the browser, fed by appends.

Why not plotly's ``FigureWidget``: it ships its own ~5 MB front-end bundle per instance and
re-sends whole traces on every update, and in busy notebooks its view stayed an empty default
figure. This widget's ES module (``run_chart.js``, ~10 KB, no library) draws three panels
(the chosen metric, step time, throughput), one ``<path>`` per rank, in a fixed ``viewBox``, so
it draws even while its output is off-screen or zero-sized, and a browser reload (the view asks
for a full state on render) brings it back.

Wire protocol (Python -> view; custom messages, JSON):

- ``{"type": "full", "gen": G, "panels": [key, "step_time_s", "steps_per_s"], "xlabel": "step",
  "series": {panel: {rank: [[x...], [y...]]}}, "tail": {panel: {rank: [x, y]}}}``: everything,
  when a view asks (``{"type": "request_full"}``, sent by every view on render), when the metric
  changes and when traces are thinned.
- ``{"type": "append", "gen": G, "series": {...new points only...}, "tail": {...}}``: at most
  one per :meth:`LiveChart.push` (the dashboard pushes at most twice a second). A view whose
  ``gen`` differs asks for a full state instead.
- ``{"type": "thin", "from_gen": G, "gen": G + 1, "factor": k}``: keep every ``k``-th point of
  every trace (the first included); a view not at ``from_gen`` asks for a full state.
- ``tail`` is a trace's newest point when thinning skipped it (drawn at the line's end):
  ``{panel: {rank: [x, y]}}``, or ``{panel: [x, {rank: y}]}`` when the ranks share that x.

Thinning keeps the traffic of a run bounded: each trace keeps every ``stride``-th point (source
index); when a trace passes ``max_points`` the stride grows by a power of two and a ``thin``
message tells the view to drop the same points itself, so a run sends about 2 x ``max_points``
points per trace however long it runs.

Traits: ``title``, ``metrics`` (metrics offered in the view's dropdown), ``key`` (the chosen one;
set by the view), ``xlabel``.
"""

from __future__ import annotations

import pathlib
import threading
from collections.abc import Callable
from typing import Any

import anywidget
import ipywidgets
import traitlets

__all__ = ["LiveChart", "FIXED_PANELS", "PANEL_TITLES"]

FIXED_PANELS = ("step_time_s", "steps_per_s")
"""The two panels drawn right of the chosen metric."""
PANEL_TITLES = {"step_time_s": "step time (s)", "steps_per_s": "throughput (steps/s)"}

# The module text, not its path: anywidget watches a path-valued _esm with a signal that holds
# every instance strongly (no widget would ever be collected).
_ESM = pathlib.Path(__file__).with_name("run_chart.js").read_text(encoding="utf-8")

SeriesFn = Callable[[str, dict[int, int]], dict[int, tuple[list[float], list[float], int]]]
"""``series(key, starts) -> {rank: (xs, ys, next_row)}``: the points of ``key`` in each rank's
records from row ``starts.get(rank, 0)`` on, and the row to start from next time."""


def _num(v: float) -> float | int:
    """Short JSON numbers: integers as ints, others to 6 significant digits."""
    if v == int(v) and abs(v) < 1e15:
        return int(v)
    return float(f"{v:.6g}")


def _compact(tail: dict[str, dict[str, list[float | int]]]) -> dict[str, Any]:
    """``{panel: {rank: [x, y]}}`` -> ``{panel: [x, {rank: y}]}`` where every rank has one x."""
    out: dict[str, Any] = {}
    for key, ranks in tail.items():
        xs = {xy[0] for xy in ranks.values()}
        out[key] = [xs.pop(), {r: xy[1] for r, xy in ranks.items()}] if len(xs) == 1 else ranks
    return out


class LiveChart(anywidget.AnyWidget):
    """Live line charts of every rank's metrics.

    Args:
        series: ``series(key, starts) -> {rank: (xs, ys, next_row)}`` (see :data:`SeriesFn`).
        title: Shown above the panels.
        max_points: Points per trace the view holds at most (thinned beyond; see module doc).
        lock: The lock ``series`` takes, if any (one lock, so the two never wait on each other).

    Call :meth:`push` after new records arrived (from any thread); it sends only new points.
    """

    _esm = _ESM

    title = traitlets.Unicode("").tag(sync=True)
    metrics = traitlets.List(traitlets.Unicode(), default_value=["loss"]).tag(sync=True)
    key = traitlets.Unicode("loss").tag(sync=True)
    xlabel = traitlets.Unicode("step").tag(sync=True)

    def __init__(self, series: SeriesFn, *, title: str = "", max_points: int = 200,
                 lock: threading.RLock | None = None) -> None:
        super().__init__(title=title)
        self._series_fn = series
        self.max_points = max_points
        self._lock = lock or threading.RLock()
        self._gen = 0
        self._stride = 1  # every trace keeps the points whose index is a multiple of it
        self._next: dict[tuple[str, int], int] = {}   # next record (row) to read, per trace
        self._seen: dict[tuple[str, int], int] = {}   # points of the trace read so far
        self._count: dict[tuple[str, int], int] = {}  # points the view holds
        self.sent_messages = 0
        self.on_msg(self._on_view_msg)
        self.observe(self._key_changed, names="key")

    @property
    def panels(self) -> list[str]:
        """Panel keys, left to right."""
        return [self.key, *(k for k in FIXED_PANELS if k != self.key)]

    @property
    def closed(self) -> bool:
        """:meth:`close` was called."""
        return self.comm is None

    def push(self) -> None:
        """Send the points that arrived since the last push (nothing if none)."""
        if self.closed:
            return
        with self._lock:
            for msg in self._append_message():
                self._send_msg(msg)

    def resend(self) -> None:
        """Send a full state (e.g. after the metric changed)."""
        if self.closed:
            return
        with self._lock:
            self._gen += 1
            self._send_msg(self._full_message())

    def close(self) -> None:
        """Close the widget and its ``Layout`` (ipywidgets leaves that open), freeing both."""
        layout = self.layout
        super().close()
        if isinstance(layout, ipywidgets.Widget):
            layout.close()

    # -- messages ------------------------------------------------------------------------------

    def _send_msg(self, msg: dict[str, Any]) -> None:
        self.sent_messages += 1
        self.send(msg)

    def _take(self, key: str, rank: int, xs: list[float], ys: list[float]
              ) -> tuple[list[float | int], list[float | int]]:
        """Of the new points ``xs, ys`` of a trace, those its stride keeps."""
        stride = self._stride
        seen = self._seen.get((key, rank), 0)
        idx = [j for j in range(len(xs)) if (seen + j) % stride == 0]
        self._seen[(key, rank)] = seen + len(xs)
        return [_num(xs[j]) for j in idx], [_num(ys[j]) for j in idx]

    def _full_message(self) -> dict[str, Any]:
        series: dict[str, dict[str, list[list[float | int]]]] = {}
        tail: dict[str, dict[str, list[float | int]]] = {}
        feeds = {key: self._series_fn(key, {}) for key in self.panels}
        n = max((len(v[0]) for data in feeds.values() for v in data.values()), default=0)
        stride = 1
        while n / stride > self.max_points / 2:  # room to grow before the next thinning
            stride *= 2
        self._stride = stride
        for key, data in feeds.items():
            series[key], tail[key] = {}, {}
            for rank, (xs, ys, next_row) in data.items():
                self._seen[(key, rank)] = 0
                self._next[(key, rank)] = next_row
                px, py = self._take(key, rank, xs, ys)
                self._count[(key, rank)] = len(px)
                series[key][str(rank)] = [px, py]
                if xs:
                    tail[key][str(rank)] = [_num(xs[-1]), _num(ys[-1])]
        return {"type": "full", "gen": self._gen, "panels": self.panels, "xlabel": self.xlabel,
                "series": series, "tail": tail}

    def _append_message(self) -> list[dict[str, Any]]:
        """The new points (one ``append``), then a ``thin`` if a trace passed ``max_points``."""
        series: dict[str, dict[str, list[list[float | int]]]] = {}
        tail: dict[str, dict[str, list[float | int]]] = {}
        for key in self.panels:
            starts = {rank: n for (k, rank), n in self._next.items() if k == key}
            for rank, (xs, ys, next_row) in self._series_fn(key, starts).items():
                self._next[(key, rank)] = next_row
                if not xs:
                    continue
                px, py = self._take(key, rank, xs, ys)
                if not px or px[-1] != _num(xs[-1]):  # the newest point, when thinning skips it
                    tail.setdefault(key, {})[str(rank)] = [_num(xs[-1]), _num(ys[-1])]
                if px:
                    self._count[(key, rank)] = self._count.get((key, rank), 0) + len(px)
                    series.setdefault(key, {})[str(rank)] = [px, py]
        out = []
        if series or tail:
            out.append({"type": "append", "gen": self._gen, "series": series,
                        "tail": _compact(tail)})
        most = max(self._count.values(), default=0)
        if most > self.max_points:  # every trace keeps every factor-th of its points
            factor = 2
            while most / factor > self.max_points / 2:
                factor *= 2
            self._stride *= factor
            for k, count in self._count.items():
                self._count[k] = -(-count // factor)
            self._gen += 1
            out.append({"type": "thin", "from_gen": self._gen - 1, "gen": self._gen,
                        "factor": factor})
        return out

    def _on_view_msg(self, _widget: Any, content: Any, _buffers: Any) -> None:
        if isinstance(content, dict) and content.get("type") == "request_full":
            with self._lock:
                self._send_msg(self._full_message())

    def _key_changed(self, change: dict[str, Any]) -> None:
        if change["new"] != change["old"]:
            self.resend()

    # -- display -------------------------------------------------------------------------------

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        bundle = super()._repr_mimebundle_(**kwargs)
        data, meta = bundle if isinstance(bundle, tuple) else (bundle or {}, {})
        return {**data, "text/plain": f"live chart {self.title!r}"}, meta
