"""The live dashboard of a training run: metrics, placement, per-worker logs, Stop, summary.

Trainer-agnostic and Ray-free: it is a :class:`~raytpu_lab.train.run.RunListener`, fed by a run's
drain thread with :class:`~raytpu_lab.train.result.RunUpdate` batches already folded into the
run's :class:`~raytpu_lab.train.result.RunResult` (:meth:`RunResult.absorb`). It keeps no copy of
the stream: it draws from the result (through :class:`~raytpu_lab.widgets.run_view.RunView`) and
uses the latest update only to know what to redraw, so ``JaxTrainer`` and ``TorchTrainer`` runs
show the same view and ``last_run`` holds exactly what the view showed.

Rules it keeps (JupyterLab stays responsive however loud the run is):

- Widgets are only ever changed by setting their values, from whatever thread; nothing is printed
  or written through ``with output:`` from a background thread (ipykernel 7 routes such output by
  thread, not by widget).
- The chart (:class:`~raytpu_lab.widgets.run_chart.LiveChart`, SVG drawn by its own small ES
  module) gets new points at most once per ``redraw_interval_s``, only points it has not got;
  log panes at most once per ``log_interval_s``, only the open pane is re-sent, and each keeps
  its rank's last ``max_log_lines`` lines.
- Button callbacks never raise into the kernel: an exception is shown in the dashboard's message
  line (a comm callback's traceback would otherwise only reach the browser console).

:meth:`RunDashboard.show` displays it (two outputs, each with a display id); :meth:`freeze`
replaces both with the small, safe static bundles of :class:`~raytpu_lab.widgets.run_view.RunView`
when the run ends (no widget view is saved). Then every widget of the dashboard is closed, so it can be garbage-collected.
"""

from __future__ import annotations

import html
import threading
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ipywidgets as w
import plotly.graph_objects as go

from raytpu_lab.train.streams import Throttle, numeric_keys
from raytpu_lab.widgets.run_chart import FIXED_PANELS, LiveChart
from raytpu_lab.widgets.run_view import PLOTLY_MIME, STATIC_POINTS, RunView, pre_lines

if TYPE_CHECKING:
    from raytpu_lab.train.result import RunResult, RunUpdate

__all__ = ["RunDashboard", "STATIC_POINTS", "PLOTLY_MIME"]

_FIXED = FIXED_PANELS


class RunDashboard:
    """A run's live view (``ipywidgets`` + plotly ``FigureWidget``) and its static form.

    Args:
        title: The run's name.
        on_stop: Called (in a background thread) when Stop is clicked; e.g. ``handle.stop``.
            Settable later, as :attr:`after_end`.
        redraw_interval_s: Minimum seconds between two chart redraws.
        log_interval_s: Minimum seconds between two log-pane redraws.
        max_log_lines: Lines kept and shown per rank.
        max_points: Points per chart trace (downsampled beyond).
        live: Build widgets (needs a widget front end); ``False`` keeps only data + static HTML.

    Attributes:
        widget: The ``ipywidgets.VBox`` to display.
        view: The :class:`~raytpu_lab.widgets.run_view.RunView` it draws from.
        after_end: Called (in the run's drain thread) after :meth:`on_end` drew the end, e.g.
            to :meth:`freeze` a view nobody waits for; ``None`` by default.
    """

    def __init__(self, title: str, *, on_stop: Callable[[], Any] | None = None,
                 redraw_interval_s: float = 0.5, log_interval_s: float = 1.0,
                 max_log_lines: int = 200, max_points: int = 300, live: bool = True) -> None:
        self.title = title
        self.on_stop = on_stop
        self.after_end: Callable[[], None] | None = None
        self.max_log_lines = max_log_lines
        self.max_points = max_points
        self.live = live
        self.view = RunView(title, max_log_lines=max_log_lines, max_points=max_points)
        self._lock = threading.RLock()
        self._keys: list[str] = []
        self._chart_throttle = Throttle(redraw_interval_s)
        self._log_throttle = Throttle(log_interval_s)
        self._status_throttle = Throttle(1.0)
        self._dirty_chart = self._dirty_table = self._dirty_logs = False
        self._drawn_slices: list[str] = []
        self.redraws = 0
        self._handles: list[Any] = []
        if live:
            self._build()

    @property
    def result(self) -> RunResult | None:
        """The run's result this dashboard draws (``None`` before the first update)."""
        return self.view.result

    @property
    def _key(self) -> str:
        return self.view.key

    @_key.setter
    def _key(self, value: str) -> None:
        self.view.key = value

    # -- widgets ---------------------------------------------------------------------------

    def _build(self) -> None:
        self.status = w.HTML(self.view.status_html())
        self.stop_button = w.Button(description="Stop", icon="stop", button_style="danger",
                                    tooltip="Abort the run and free its slices (Ray Train abort)")
        self.stop_button.on_click(self._clicked_stop)
        self.message = w.HTML("")
        self.chart = LiveChart(self._chart_series, title=self.title, lock=self._lock)
        self.chart.observe(self._key_changed, names="key")
        self.placement = w.HTML(self.view.placement_html())
        self.restarts = w.HTML("")  # the attempts, once Ray Train restarted the run
        self._logs = _LogPanes(self.view, self._lock, self.show_error)
        self.log_panes = self._logs.accordion
        self.summary = w.HTML("")
        self.widget = w.VBox([
            w.HBox([self.stop_button, self.status]), self.message, self.chart, self.restarts,
            w.HTML("<b>Placement</b>"), self.placement, w.HTML("<b>Logs</b> (last lines per rank)"),
            self.log_panes, self.summary], layout=w.Layout(width="100%"))
        self.widget.add_class("raytpu-dashboard")

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        """The live widget plus a text line and a script-free HTML status (shown by front ends
        without a widget manager, or when the notebook is opened untrusted)."""
        bundle = self.widget._repr_mimebundle_(**kwargs)
        data, meta = bundle if isinstance(bundle, tuple) else (bundle or {}, {})
        return {**data, "text/plain": self.text(),
                "text/html": f"<div><b>{html.escape(self.text())}</b></div>"}, meta

    # -- display ---------------------------------------------------------------------------

    def show(self) -> list[Any]:
        """Display the live dashboard in the current cell (two outputs with display ids: the
        widget, and a place for the tables :meth:`freeze` writes); returns the handles."""
        from IPython.display import display

        self._handles = [display(self, display_id=True),  # type: ignore[no-untyped-call]
                         display({"text/plain": ""}, raw=True,  # type: ignore[no-untyped-call]
                                 display_id=True)]
        return self._handles

    def freeze(self) -> None:
        """Replace the displayed live view with its static bundles and close every widget.

        Safe to call more than once and without :meth:`show` (then it only closes).
        """
        with self._lock:
            handles, self._handles = self._handles, []
            if handles:
                chart = self.static_chart_bundle() if self.view.rows() else {"text/plain": ""}
                handles[0].update(chart, raw=True)
                if len(handles) > 1:
                    handles[1].update(self.static_tables_bundle(), raw=True)
            self.close()

    def close(self) -> None:
        """Close every widget of the dashboard (the live view stops; the data stays)."""
        if not self.live:
            return
        for widget in self._all_widgets():
            widget.close()

    @property
    def closed(self) -> bool:
        """:meth:`close` was called (or the dashboard was built without widgets)."""
        return not self.live or self.widget.comm is None

    def _all_widgets(self) -> list[w.Widget]:
        return _widgets_below([self.widget, self.chart])

    # -- listener --------------------------------------------------------------------------

    def on_update(self, update: RunUpdate) -> None:
        """Take one batch from the drain thread (folded into the run's result already, see
        :meth:`RunResult.absorb`); redraw what changed if its throttle allows.

        Raises:
            ValueError: ``update`` was not folded into a result (its ``result`` is ``None``).
        """
        if update.result is None:
            raise ValueError("RunDashboard.on_update needs an update folded into the run's "
                             "result: result.absorb(update)")
        with self._lock:
            view = self.view
            view.result = update.result
            view.elapsed_s = update.elapsed_s
            if view.state == "starting" and (update.workers or update.records):
                view.state = "running"
            if update.records:
                self._dirty_chart = True
            if update.workers or update.errors or update.restarts \
                    or update.slices != self._drawn_slices:
                self._drawn_slices = list(update.slices)
                self._dirty_table = True
            if update.logs or update.dropped:
                self._dirty_logs = True
            self._redraw(final=False)

    def on_end(self, result: RunResult) -> None:
        """The run ended: final redraw, summary, Stop disabled."""
        with self._lock:
            view = self.view
            view.result = result
            view.ended = True
            view.elapsed_s = result.wall_s
            view.state = ("failed" if result.error else "stopped" if result.stopped
                          else "finished")
            self._dirty_chart = self._dirty_table = self._dirty_logs = True
            self._redraw(final=True)
            if self.live:
                self.stop_button.disabled = True
                self.summary.value = view.summary_html()
        if self.after_end is not None:  # outside the lock: freezing takes it itself
            self.after_end()

    def show_error(self, text: str) -> None:
        """Show ``text`` in the dashboard's message line (red)."""
        if self.live:
            self.message.value = f"<pre class='raytpu-err'>{html.escape(text)}</pre>"

    # -- drawing ---------------------------------------------------------------------------

    def _redraw(self, *, final: bool) -> None:
        if not self.live:
            return
        try:
            if final or self._status_throttle.ready():  # its seconds change every second
                self.status.value = self.view.status_html()
            if self._dirty_chart and (final or self._chart_throttle.ready()):
                self._draw_chart()
                self._dirty_chart = False
                self.redraws += 1
            if self._dirty_table:
                self.placement.value = self.view.placement_html()
                self.restarts.value = self.view.restarts_html()
                if self.view.errors:
                    self.message.value = self.view.errors_html()
                self._dirty_table = False
            if self._dirty_logs and (final or self._log_throttle.ready()):
                self._logs.draw()
                self._dirty_logs = False
        except Exception:  # a drawing bug shows in the view, never kills the drain thread
            self.show_error("dashboard error:\n" + traceback.format_exc())

    def _chart_series(self, key: str, starts: dict[int, int]
                      ) -> dict[int, tuple[list[float], list[float], int]]:
        """The live chart's feed (:meth:`RunView.chart_series`)."""
        with self._lock:
            return self.view.chart_series(key, starts)

    def _draw_chart(self) -> None:
        all_rows = [r for rows in self.view.rows().values() for r in rows[-5:]]
        keys = numeric_keys(all_rows) if all_rows else []
        keys = keys + [k for k in _FIXED if k not in keys]
        chart = self.chart
        with chart.hold_sync():
            if keys != self._keys:
                self._keys = keys
                if self._key not in keys:
                    self._key = _default_key(keys)
                chart.metrics = list(keys)
            chart.xlabel = self.view.xlabel()
        if chart.key != self._key:
            chart.key = self._key  # sends a full state
        else:
            chart.push()

    # -- callbacks (kernel thread) -----------------------------------------------------------

    def _clicked_stop(self, _button: Any) -> None:
        try:
            if self.on_stop is None:
                raise RuntimeError("this dashboard is not attached to a run")
            self.stop_button.disabled = True
            self.stop_button.description = "Stopping..."
            with self._lock:
                self.view.state = "stopping"
                self.status.value = self.view.status_html()
            threading.Thread(target=self._stop_in_background, name="raytpu-stop",
                             daemon=True).start()
        except Exception:
            self.show_error("Stop failed:\n" + traceback.format_exc())

    def _stop_in_background(self) -> None:
        try:
            assert self.on_stop is not None
            freed = self.on_stop()
            if freed is False:
                self.show_error("Stop: the run did not end within 10 s; see %raytpu status.")
        except Exception:
            self.show_error("Stop failed:\n" + traceback.format_exc())
        finally:
            self.stop_button.description = "Stop"

    def _key_changed(self, change: dict[str, Any]) -> None:
        try:
            with self._lock:
                if change["new"] and change["new"] != self._key and change["new"] in self._keys:
                    self._key = change["new"]
        except Exception:
            self.show_error("metric change failed:\n" + traceback.format_exc())

    # -- static forms (drawn by the view, under the lock) --------------------------------------

    def text(self) -> str:
        """One status line: state, elapsed seconds, steps, steps/s, slices."""
        return self.view.text()

    def static_figure(self, max_points: int = STATIC_POINTS) -> go.Figure:
        """The charts as a plain plotly figure (:meth:`RunView.static_figure`)."""
        with self._lock:
            return self.view.static_figure(max_points)

    def static_svg(self) -> str:
        """The chart as an SVG image (:meth:`RunView.static_svg`)."""
        with self._lock:
            return self.view.static_svg()

    def static_chart_bundle(self) -> dict[str, Any]:
        """``{plotly JSON, image/svg+xml, text/plain}`` of the chart: small, safe, no script."""
        with self._lock:
            return self.view.static_chart_bundle()

    def static_tables_bundle(self) -> dict[str, str]:
        """Status, errors, placement, summary and logs as script-free HTML + ``text/plain``."""
        return {"text/html": self.static_html(chart=False), "text/plain": self.text()}

    def static_html(self, *, chart: bool = True) -> str:
        """Everything as one script-free HTML fragment (:meth:`RunView.static_html`)."""
        with self._lock:
            return self.view.static_html(chart=chart)


class _LogPanes:
    """One accordion pane per rank with its last lines; only the open pane is ever sent, and
    only when its rank logged since it was last drawn."""

    def __init__(self, view: RunView, lock: threading.RLock,
                 show_error: Callable[[str], None]) -> None:
        self._view = view
        self._lock = lock
        self._show_error = show_error
        self._drawn: dict[int, int] = {}  # rank -> log revision drawn
        self.accordion = w.Accordion(children=[])
        self.accordion.observe(self._opened, names="selected_index")

    def draw(self) -> None:
        ranks = self._view.logs.ranks
        panes = list(self.accordion.children)
        if len(panes) < len(ranks):
            panes += [w.HTML("") for _ in range(len(ranks) - len(panes))]
            self.accordion.children = panes
        titles = tuple(self._view.log_title(r) for r in ranks)
        if tuple(self.accordion.titles) != titles:
            self.accordion.titles = titles
        opened = self.accordion.selected_index
        if opened is not None and opened < len(ranks):
            self._fill(ranks[opened], panes[opened])

    def _fill(self, rank: int, pane: w.HTML) -> None:
        rev = self._view.logs.revision(rank)
        if self._drawn.get(rank) != rev:
            pane.value = pre_lines(self._view.log_tail(rank))
            self._drawn[rank] = rev

    def _opened(self, change: dict[str, Any]) -> None:  # kernel thread: a user opened a pane
        try:
            with self._lock:
                i = change["new"]
                ranks = self._view.logs.ranks
                if i is not None and i < len(ranks):
                    self._fill(ranks[i], self.accordion.children[i])
        except Exception:
            self._show_error("log pane failed:\n" + traceback.format_exc())


def _widgets_below(roots: list[w.Widget]) -> list[w.Widget]:
    """Every widget of these trees (children, layouts, styles), each once."""
    out: list[w.Widget] = []

    def walk(x: Any) -> None:
        if not isinstance(x, w.Widget) or x in out:
            return
        out.append(x)
        for name in ("children", "layout", "style"):
            value = getattr(x, name, None)
            for child in value if isinstance(value, list | tuple) else [value]:
                walk(child)

    for root in roots:
        walk(root)
    return out


def _default_key(keys: list[str]) -> str:
    """The metric shown first: ``loss``, else a ``*loss*`` key, else the first that is not a
    counter (``step``, ``epoch``) or a derived rate."""
    if "loss" in keys:
        return "loss"
    return next((k for k in keys if "loss" in k), None) or next(
        (k for k in keys if k not in ("step", "epoch", "report", *_FIXED)), keys[0])
