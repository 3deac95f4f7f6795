"""The live dashboard of a training run: metrics, placement, per-worker logs, Stop, summary.

Trainer-agnostic and Ray-free: it is a :class:`~raytpu_lab.train.run.RunListener`, fed by a run's
drain thread with :class:`~raytpu_lab.train.run.RunUpdate` batches (what workers passed to
``ray.train.report``, where each rank runs, what it printed, how it failed), so ``JaxTrainer`` and
``TorchTrainer`` runs show the same view.

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
replaces both with small, safe static bundles when the run ends (no widget view is saved):

- the chart as ``application/vnd.plotly.v1+json`` (plotly's own JupyterLab renderer draws it with
  no kernel and no trust; at most :data:`STATIC_POINTS` points in all, no plotly.js inside) +
  ``image/svg+xml`` (:func:`~raytpu_lab.widgets.chart_svg.render_chart_svg`: nbconvert, VS Code,
  GitHub) + ``text/plain``;
- status, errors, placement, summary and logs as script-free ``text/html`` + ``text/plain``.

Then every widget of the dashboard is closed, so it can be garbage-collected.
"""

from __future__ import annotations

import html
import json
import threading
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ipywidgets as w
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from raytpu_lab.train.result import progress
from raytpu_lab.train.streams import (
    PLACEMENT_COLUMNS,
    LogBook,
    Throttle,
    downsample,
    metric_series,
    numeric_keys,
    placement_table,
)
from raytpu_lab.widgets.chart_svg import PALETTE, render_chart_svg
from raytpu_lab.widgets.run_chart import FIXED_PANELS, PANEL_TITLES, LiveChart
from raytpu_lab.widgets.svg import svg_img

if TYPE_CHECKING:
    from raytpu_lab.train.result import RunResult
    from raytpu_lab.train.run import RunUpdate

__all__ = ["RunDashboard", "STATIC_POINTS", "PLOTLY_MIME"]

PLOTLY_MIME = "application/vnd.plotly.v1+json"
STATIC_POINTS = 6000
"""Points in all traces of the saved plotly chart (each trace at most 2,000): ~100 KB of JSON."""
_FIXED = FIXED_PANELS
_TITLES = PANEL_TITLES
_SVG_POINTS = 150  # per trace of the saved SVG
_STYLE = ("<style>.raytpu-dash table{border-collapse:collapse;font-size:12px}"
          ".raytpu-dash td,.raytpu-dash th{border:1px solid #ddd;padding:2px 6px;text-align:left}"
          ".raytpu-dash pre{max-height:320px;overflow:auto;font-size:11px;margin:0;"
          "background:#fafafa;padding:4px}.raytpu-err{color:#b00020}</style>")


class RunDashboard:
    """A run's live view (``ipywidgets`` + plotly ``FigureWidget``) and its static form.

    Args:
        title: The run's name.
        on_stop: Called (in a background thread) when Stop is clicked; e.g. ``handle.stop``.
        redraw_interval_s: Minimum seconds between two chart redraws.
        log_interval_s: Minimum seconds between two log-pane redraws.
        max_log_lines: Lines kept and shown per rank.
        max_points: Points per chart trace (downsampled beyond).
        live: Build widgets (needs a widget front end); ``False`` keeps only data + static HTML.

    Attributes:
        widget: The ``ipywidgets.VBox`` to display.
    """

    def __init__(self, title: str, *, on_stop: Callable[[], Any] | None = None,
                 redraw_interval_s: float = 0.5, log_interval_s: float = 1.0,
                 max_log_lines: int = 200, max_points: int = 300, live: bool = True) -> None:
        self.title = title
        self.on_stop = on_stop
        self.max_log_lines = max_log_lines
        self.max_points = max_points
        self.live = live
        self._lock = threading.RLock()
        self._rows: dict[int, list[dict[str, Any]]] = {}
        self._workers: list[dict[str, Any]] = []
        self._errors: list[dict[str, Any]] = []
        self._logs = LogBook(max_lines=max_log_lines)
        self._slices: list[str] = []
        self._keys: list[str] = []
        self._key = "loss"
        self._chart_throttle = Throttle(redraw_interval_s)
        self._log_throttle = Throttle(log_interval_s)
        self._status_throttle = Throttle(1.0)
        self._dirty_chart = self._dirty_table = self._dirty_logs = False
        self._drawn_log_rev: dict[int, int] = {}
        self._elapsed_s = 0.0
        self._state = "starting"
        self._result: RunResult | None = None
        self.redraws = 0
        self._handles: list[Any] = []
        if live:
            self._build()

    # -- widgets ---------------------------------------------------------------------------

    def _build(self) -> None:
        self.status = w.HTML(self._status_html())
        self.stop_button = w.Button(description="Stop", icon="stop", button_style="danger",
                                    tooltip="Abort the run and free its slices (Ray Train abort)")
        self.stop_button.on_click(self._clicked_stop)
        self.message = w.HTML("")
        self.chart = LiveChart(self._chart_series, title=self.title, lock=self._lock)
        self.chart.observe(self._key_changed, names="key")
        self.placement = w.HTML(self._placement_html())
        self.log_panes = w.Accordion(children=[])
        self.log_panes.observe(self._pane_opened, names="selected_index")
        self.summary = w.HTML("")
        self.widget = w.VBox([
            w.HBox([self.stop_button, self.status]), self.message, self.chart,
            w.HTML("<b>Placement</b>"), self.placement, w.HTML("<b>Logs</b> (last lines per rank)"),
            self.log_panes, self.summary], layout=w.Layout(width="100%"))
        self.widget.add_class("raytpu-dashboard")

    def _base_figure(self) -> go.Figure:
        fig = make_subplots(rows=1, cols=3, subplot_titles=(self._key, *(_TITLES[k] for k in _FIXED)))
        fig.update_layout(title=self.title, height=370, margin={"t": 90, "b": 80, "l": 50, "r": 20},
                          legend={"orientation": "h", "y": -0.32})
        fig.update_xaxes(title_text=self._xlabel())
        return fig

    def _xlabel(self) -> str:
        return "step" if any("step" in r for rows in self._rows.values() for r in rows[:1]) \
            else "report"

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

        self._handles = [display(self, display_id=True),
                         display({"text/plain": ""}, raw=True, display_id=True)]
        return self._handles

    def freeze(self) -> None:
        """Replace the displayed live view with its static bundles and close every widget.

        Safe to call more than once and without :meth:`show` (then it only closes).
        """
        with self._lock:
            handles, self._handles = self._handles, []
            if handles:
                chart = self.static_chart_bundle() if self._rows else {"text/plain": ""}
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
        out: list[w.Widget] = []

        def walk(x: Any) -> None:
            if not isinstance(x, w.Widget) or x in out:
                return
            out.append(x)
            for name in ("children", "layout", "style"):
                value = getattr(x, name, None)
                for child in value if isinstance(value, list | tuple) else [value]:
                    walk(child)

        walk(self.widget)
        if self.chart not in out:
            walk(self.chart)
        return out

    # -- listener --------------------------------------------------------------------------

    def on_update(self, update: RunUpdate) -> None:
        """Take one batch from the drain thread; redraw what changed if its throttle allows."""
        with self._lock:
            self._elapsed_s = update.elapsed_s
            if self._state == "starting" and (update.workers or update.records):
                self._state = "running"
            for r in update.records:
                self._rows.setdefault(int(r["rank"]), []).append(r)
            if update.records:
                self._dirty_chart = True
            if update.workers or update.errors or update.slices != self._slices:
                self._workers.extend(update.workers)
                self._errors.extend(update.errors)
                self._slices = list(update.slices)
                self._dirty_table = True
            by_rank: dict[int, list[tuple[str, str]]] = {}
            for rank, stream, text in update.logs:
                by_rank.setdefault(rank, []).append((stream, text))
            for rank in set(by_rank) | set(update.dropped):
                self._logs.add(rank, by_rank.get(rank, []), dropped=update.dropped.get(rank, 0),
                               time_s=update.elapsed_s)
                self._dirty_logs = True
            self._redraw(final=False)

    def on_end(self, result: RunResult) -> None:
        """The run ended: final redraw, summary, Stop disabled."""
        with self._lock:
            self._result = result
            self._elapsed_s = result.wall_s
            self._state = ("failed" if result.error else "stopped" if result.stopped
                           else "finished")
            self._dirty_chart = self._dirty_table = self._dirty_logs = True
            self._redraw(final=True)
            if self.live:
                self.stop_button.disabled = True
                self.summary.value = self._summary_html()

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
                self.status.value = self._status_html()
            if self._dirty_chart and (final or self._chart_throttle.ready()):
                self._draw_chart()
                self._dirty_chart = False
                self.redraws += 1
            if self._dirty_table:
                self.placement.value = self._placement_html()
                if self._errors:
                    self.message.value = self._errors_html()
                self._dirty_table = False
            if self._dirty_logs and (final or self._log_throttle.ready()):
                self._draw_logs()
                self._dirty_logs = False
        except Exception:  # a drawing bug shows in the view, never kills the drain thread
            self.show_error("dashboard error:\n" + traceback.format_exc())

    def _series(self, key: str, max_points: int | None = None
                ) -> dict[int, tuple[list[float], list[float]]]:
        n = self.max_points if max_points is None else max_points
        return {rank: downsample(*metric_series(rows, key), n)
                for rank, rows in sorted(self._rows.items())}

    def _chart_series(self, key: str, starts: dict[int, int]
                      ) -> dict[int, tuple[list[float], list[float], int]]:
        """Points of ``key`` per rank from row ``starts[rank]`` on (the live chart's feed)."""
        with self._lock:
            out: dict[int, tuple[list[float], list[float], int]] = {}
            for rank, rows in sorted(self._rows.items()):
                start = starts.get(rank, 0)
                if start >= len(rows):
                    out[rank] = ([], [], len(rows))
                    continue
                sub = rows[max(0, start - 1):]  # one row before: derived keys need it
                xs, ys = metric_series(sub, key)
                if start > 0 and metric_series(sub[:1], key)[0]:
                    xs, ys = xs[1:], ys[1:]  # that row's own point was sent before
                out[rank] = (xs, ys, len(rows))
            return out

    def _draw_chart(self) -> None:
        all_rows = [r for rows in self._rows.values() for r in rows[-5:]]
        keys = numeric_keys(all_rows) if all_rows else []
        keys = keys + [k for k in _FIXED if k not in keys]
        chart = self.chart
        with chart.hold_sync():
            if keys != self._keys:
                self._keys = keys
                if self._key not in keys:
                    self._key = _default_key(keys)
                chart.metrics = list(keys)
            chart.xlabel = self._xlabel()
        if chart.key != self._key:
            chart.key = self._key  # sends a full state
        else:
            chart.push()

    def _draw_logs(self) -> None:
        ranks = self._logs.ranks
        panes = list(self.log_panes.children)
        if len(panes) < len(ranks):
            panes += [w.HTML("") for _ in range(len(ranks) - len(panes))]
            self.log_panes.children = panes
        titles = tuple(self._log_title(r) for r in ranks)
        if tuple(self.log_panes.titles) != titles:
            self.log_panes.titles = titles
        opened = self.log_panes.selected_index
        if opened is not None and opened < len(ranks):
            self._fill_pane(ranks[opened], panes[opened])

    def _fill_pane(self, rank: int, pane: w.HTML) -> None:
        rev = self._logs.revision(rank)
        if self._drawn_log_rev.get(rank) != rev:
            pane.value = _pre(self._logs.tail(rank))
            self._drawn_log_rev[rank] = rev

    def _log_title(self, rank: int) -> str:
        total, dropped = self._logs.counts(rank)
        host = next((x.get("host") for x in reversed(self._workers) if x["rank"] == rank), "")
        failed = " - raised" if any(e["rank"] == rank for e in self._errors) else ""
        cut = f", last {self.max_log_lines} shown" if dropped else ""
        return f"rank {rank} {host} - {total} lines{cut}{failed}"

    # -- callbacks (kernel thread) -----------------------------------------------------------

    def _clicked_stop(self, _button: Any) -> None:
        try:
            if self.on_stop is None:
                raise RuntimeError("this dashboard is not attached to a run")
            self.stop_button.disabled = True
            self.stop_button.description = "Stopping..."
            with self._lock:
                self._state = "stopping"
                self.status.value = self._status_html()
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

    def _pane_opened(self, change: dict[str, Any]) -> None:
        try:
            with self._lock:
                i = change["new"]
                ranks = self._logs.ranks
                if i is not None and i < len(ranks):
                    self._fill_pane(ranks[i], self.log_panes.children[i])
        except Exception:
            self.show_error("log pane failed:\n" + traceback.format_exc())

    # -- text and static HTML --------------------------------------------------------------

    def text(self) -> str:
        """One status line: state, elapsed seconds, steps, steps/s, slices."""
        count, rate, what = progress(self._rows.get(0) or next(iter(self._rows.values()), []))
        where = f" on {', '.join(self._slices)}" if self._slices else ""
        return (f"run {self.title!r} {self._state}{where}: {self._elapsed_s:.0f} s, "
                f"{count} {what}, {rate:.2f} {what}/s, {len(self._workers)} workers")

    def _status_html(self) -> str:
        color = {"failed": "#b00020", "stopped": "#a15c00", "finished": "#1b5e20"}.get(
            self._state, "#0d47a1")
        return f"<span style='color:{color}'>{html.escape(self.text())}</span>"

    def _placement_html(self) -> str:
        rows = placement_table(self._workers)
        if not rows:
            return "<i>waiting for workers to start...</i>"
        failed = {e["rank"] for e in self._errors}
        head = "".join(f"<th>{c}</th>" for c in PLACEMENT_COLUMNS)
        body = "".join(
            f"<tr{' class=raytpu-err' if r['rank'] in failed else ''}>"
            + "".join(f"<td>{html.escape('' if r[c] is None else str(r[c]))}</td>"
                      for c in PLACEMENT_COLUMNS) + "</tr>" for r in rows)
        return f"{_STYLE}<div class='raytpu-dash'><table><tr>{head}</tr>{body}</table></div>"

    def _errors_html(self) -> str:
        parts = []
        for e in sorted(self._errors, key=lambda e: e["rank"]):
            where = f"rank {e['rank']} on host {e.get('host')}"
            if e.get("slice"):
                where += f" ({e['slice']} worker {e.get('worker_id')})"
            parts.append(f"<details open><summary class='raytpu-err'>{html.escape(where)} raised "
                         f"{html.escape(e['error'])}</summary>{_pre_text(e['traceback'])}</details>")
        return f"{_STYLE}<div class='raytpu-dash'>{''.join(parts)}</div>"

    def _summary_html(self) -> str:
        r = self._result
        if r is None:
            return ""
        s = r.summary()
        rows = [("state", self._state), ("wall time", f"{s['wall_s']} s"),
                (s["counts"], s["steps"]), (f"{s['counts']}/s", s["steps_per_s"]), ("final metrics", s["final_metrics"]),
                ("slices", ", ".join(s["slices"])),
                ("storage (checkpoints, results, traces)", s["storage_path"] or "-")]
        if r.error:
            rows.append(("error", r.error.splitlines()[0]))
        body = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
                       for k, v in rows)
        return f"{_STYLE}<div class='raytpu-dash'><b>Summary</b><table>{body}</table></div>"

    def static_figure(self, max_points: int = STATIC_POINTS) -> go.Figure:
        """The charts as a plain plotly figure; a dropdown (plotly's own) picks the metric.

        Args:
            max_points: Points in all traces together (each trace keeps at most 2,000).
        """
        with self._lock:
            fig = self._base_figure()
            ranks = sorted(self._rows)
            all_rows = [r for rows in self._rows.values() for r in rows]
            keys = [k for k in numeric_keys(all_rows) if k not in (*_FIXED, "step")] or [self._key]
            first = self._key if self._key in keys else keys[0]
            per_trace = max(20, min(2000, max_points // max(1, len(ranks) * (len(keys) + 2))))
            for key in keys:
                for rank, (x, y) in self._series(key, per_trace).items():
                    fig.add_trace(go.Scatter(x=_short(x), y=_short(y), mode="lines",
                                             name=f"rank {rank}", legendgroup=f"rank {rank}",
                                             visible=key == first, showlegend=True, meta=key,
                                             line={"color": PALETTE[rank % len(PALETTE)]}),
                                  row=1, col=1)
            for col, key in enumerate(_FIXED, start=2):
                for rank, (x, y) in self._series(key, per_trace).items():
                    fig.add_trace(go.Scatter(x=_short(x), y=_short(y), mode="lines",
                                             name=f"rank {rank}", legendgroup=f"rank {rank}",
                                             showlegend=False, meta=key,
                                             line={"color": PALETTE[rank % len(PALETTE)]}),
                                  row=1, col=col)
            fig.layout.annotations[0].text = first
            n_fixed = len(_FIXED) * len(ranks)
            if len(keys) > 1:
                buttons = []
                for key in keys:
                    visible = [k == key for k in keys for _ in ranks] + [True] * n_fixed
                    buttons.append({"label": key, "method": "update",
                                    "args": [{"visible": visible},
                                             {"annotations[0].text": key}]})
                # left of the title row, above the subplot titles: it covers no label
                fig.update_layout(updatemenus=[{"buttons": buttons, "x": 1.0, "y": 1.2,
                                                "xanchor": "right", "yanchor": "bottom",
                                                "active": keys.index(first)}])
            return fig

    def static_svg(self) -> str:
        """The chart as an SVG image (the chosen metric, step time, throughput; every rank)."""
        with self._lock:
            key = self._key if any(self._series(self._key, 2).values()) else next(
                (k for k in numeric_keys([r for rows in self._rows.values() for r in rows])
                 if k not in _FIXED), self._key)
            panels = [(k if k == key else _TITLES.get(k, k), self._series(k, _SVG_POINTS))
                      for k in (key, *_FIXED)]
            return render_chart_svg(self.text(), panels, xlabel=self._xlabel())

    def static_chart_bundle(self) -> dict[str, Any]:
        """``{plotly JSON, image/svg+xml, text/plain}`` of the chart: small, safe, no script."""
        fig = json.loads(self.static_figure().to_json())
        fig.get("layout", {}).pop("template", None)  # ~10 KB of styling plotly.js has anyway
        fig["config"] = {"displaylogo": False, "responsive": True}
        return {PLOTLY_MIME: fig, "image/svg+xml": self.static_svg(), "text/plain": self.text()}

    def static_tables_bundle(self) -> dict[str, str]:
        """Status, errors, placement, summary and logs as script-free HTML + ``text/plain``."""
        return {"text/html": self.static_html(chart=False), "text/plain": self.text()}

    def static_html(self, *, chart: bool = True) -> str:
        """Everything as one script-free HTML fragment; the chart (if ``chart``) as an ``<img>``
        of :meth:`static_svg` (JupyterLab's sanitizer keeps it in untrusted notebooks)."""
        with self._lock:
            parts = [_STYLE, "<div class='raytpu-dash'>",
                     f"<div><b>{html.escape(self.text())}</b></div>"]
            if self._errors:
                parts.append(self._errors_html())
            if chart and self._rows:
                parts.append(_img(self.static_svg(), "metrics of every rank"))
            parts += ["<b>Placement</b>", self._placement_html(), self._summary_html(),
                      "<b>Logs</b> (last lines per rank)"]
            for rank in self._logs.ranks:
                parts.append(f"<details><summary>{html.escape(self._log_title(rank))}</summary>"
                             f"{_pre(self._logs.tail(rank))}</details>")
            parts.append("</div>")
            return "".join(parts)


def _default_key(keys: list[str]) -> str:
    """The metric shown first: ``loss``, else a ``*loss*`` key, else the first that is not a
    counter (``step``, ``epoch``) or a derived rate."""
    if "loss" in keys:
        return "loss"
    return next((k for k in keys if "loss" in k), None) or next(
        (k for k in keys if k not in ("step", "epoch", "report", *_FIXED)), keys[0])


def _short(values: list[float]) -> list[float]:
    """6 significant digits: the saved JSON stays small."""
    return [v if v == int(v) else float(f"{v:.6g}") for v in values]


def _img(svg: str, alt: str) -> str:
    return svg_img(svg, alt)


def _pre(lines: list[tuple[str, str]]) -> str:
    return "<pre>" + "\n".join(
        f"<span class='raytpu-err'>{html.escape(t)}</span>" if s == "stderr" else html.escape(t)
        for s, t in lines) + "</pre>"


def _pre_text(text: str) -> str:
    return f"<pre>{html.escape(text)}</pre>"
