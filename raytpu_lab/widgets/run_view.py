"""A training run drawn without widgets: status line, chart figures, tables, static bundles.

:class:`RunView` only reads the run's :class:`~raytpu_lab.train.result.RunResult` (the one
accumulator of its stream) and a few view choices (state, chosen metric); the live
:class:`~raytpu_lab.widgets.run_dashboard.RunDashboard` draws its widgets from it and, when the
run ends, replaces them with its static bundles:

- the chart as ``application/vnd.plotly.v1+json`` (plotly's own JupyterLab renderer draws it with
  no kernel and no trust; at most :data:`STATIC_POINTS` points in all, no plotly.js inside) +
  ``image/svg+xml`` (:func:`~raytpu_lab.widgets.chart_svg.render_chart_svg`: nbconvert, VS Code,
  GitHub) + ``text/plain``;
- status, errors, placement, summary and logs as script-free ``text/html`` + ``text/plain``.
"""

from __future__ import annotations

import html
import json
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from raytpu_lab.train.attempts import restart_lines
from raytpu_lab.train.protocols import ErrorRow, PlacementRow, Record
from raytpu_lab.train.result import RunResult
from raytpu_lab.train.streams import (
    PLACEMENT_COLUMNS,
    LogBook,
    downsample,
    metric_series,
    numeric_keys,
    placement_table,
)
from raytpu_lab.widgets.chart_svg import PALETTE, render_chart_svg
from raytpu_lab.widgets.goodput_svg import render_goodput_svg
from raytpu_lab.widgets.run_chart import FIXED_PANELS, PANEL_TITLES
from raytpu_lab.widgets.svg import svg_img

__all__ = ["PLOTLY_MIME", "RunView", "STATIC_POINTS"]

PLOTLY_MIME = "application/vnd.plotly.v1+json"
STATIC_POINTS = 6000
"""Points in all traces of the saved plotly chart (each trace at most 2,000): ~100 KB of JSON."""
_FIXED = FIXED_PANELS
_TITLES = PANEL_TITLES
_SVG_POINTS = 150  # per trace of the saved SVG
STYLE = ("<style>.raytpu-dash table{border-collapse:collapse;font-size:12px}"
         ".raytpu-dash td,.raytpu-dash th{border:1px solid #ddd;padding:2px 6px;text-align:left}"
         ".raytpu-dash pre{max-height:320px;overflow:auto;font-size:11px;margin:0;"
         "background:#fafafa;padding:4px}.raytpu-err{color:#b00020}</style>")
_EMPTY_LOGS = LogBook()


class RunView:
    """What a run looks like, read from its result (see the module docstring).

    Args:
        title: The run's name.
        max_log_lines: Lines shown per rank.
        max_points: Points per chart trace of the live chart (downsampled beyond).

    Attributes:
        result: The run's result (``None`` until the first update).
        state: ``"starting"``, ``"running"``, ``"stopping"``, ``"finished"``, ``"failed"`` or
            ``"stopped"``.
        elapsed_s: Seconds since launch, as of the latest update.
        key: The metric shown in the first panel.
        ended: The run ended (its summary is shown).
    """

    def __init__(self, title: str, *, max_log_lines: int = 200, max_points: int = 300) -> None:
        self.title = title
        self.max_log_lines = max_log_lines
        self.max_points = max_points
        self.result: RunResult | None = None
        self.state = "starting"
        self.elapsed_s = 0.0
        self.key = "loss"
        self.ended = False

    # -- what the result holds ---------------------------------------------------------------

    def rows(self) -> dict[int, list[Record]]:
        """Records per rank."""
        return dict(sorted(self.result.by_rank().items())) if self.result is not None else {}

    @property
    def workers(self) -> list[PlacementRow]:
        return self.result.workers if self.result is not None else []

    @property
    def errors(self) -> list[ErrorRow]:
        return self.result.worker_errors if self.result is not None else []

    @property
    def logs(self) -> LogBook:
        return self.result.logs if self.result is not None else _EMPTY_LOGS

    @property
    def slices(self) -> list[str]:
        return self.result.slice_names if self.result is not None else []

    def series(self, key: str, max_points: int | None = None
               ) -> dict[int, tuple[list[float], list[float]]]:
        """``{rank: (xs, ys)}`` of ``key``, each downsampled to ``max_points``."""
        n = self.max_points if max_points is None else max_points
        return {rank: downsample(*metric_series(rows, key), n) for rank, rows in self.rows().items()}

    def chart_series(self, key: str, starts: dict[int, int]
                     ) -> dict[int, tuple[list[float], list[float], int]]:
        """Points of ``key`` per rank from row ``starts[rank]`` on, and each rank's row count
        (the live chart's feed: it asks only for what it has not got)."""
        out: dict[int, tuple[list[float], list[float], int]] = {}
        for rank, rows in self.rows().items():
            count = len(rows)  # the drain thread may append meanwhile: read up to here
            start = starts.get(rank, 0)
            if start >= count:
                out[rank] = ([], [], count)
                continue
            sub = rows[max(0, start - 1):count]  # one row before: derived keys need it
            xs, ys = metric_series(sub, key)
            if start > 0 and metric_series(sub[:1], key)[0]:
                xs, ys = xs[1:], ys[1:]  # that row's own point was sent before
            out[rank] = (xs, ys, count)
        return out

    def xlabel(self) -> str:
        return "step" if any("step" in r for rows in self.rows().values() for r in rows[:1]) \
            else "report"

    def log_tail(self, rank: int) -> list[tuple[str, str]]:
        return self.logs.tail(rank, self.max_log_lines)

    def log_title(self, rank: int) -> str:
        total, dropped = self.logs.counts(rank)
        host = next((x.get("host") for x in reversed(self.workers) if x["rank"] == rank), "")
        failed = " - raised" if any(e["rank"] == rank for e in self.errors) else ""
        cut = f", last {self.max_log_lines} shown" if dropped or total > self.max_log_lines else ""
        return f"rank {rank} {host} - {total} lines{cut}{failed}"

    # -- text and HTML -----------------------------------------------------------------------

    def text(self) -> str:
        """One status line: state, elapsed seconds, steps, steps/s, slices."""
        r = self.result
        count, rate, what = (r.steps, r.steps_per_s, r.counts) if r is not None else (0, 0.0,
                                                                                       "reports")
        where = f" on {', '.join(self.slices)}" if self.slices else ""
        restarts = len(r.restarts) if r is not None else 0
        again = f" (attempt {restarts + 1}, {restarts} restart{'s' * (restarts > 1)})" \
            if restarts else ""
        workers = len({w["rank"] for w in self.workers})
        return (f"run {self.title!r} {self.state}{again}{where}: {self.elapsed_s:.0f} s, "
                f"{count} {what}, {rate:.2f} {what}/s, {workers} workers")

    def status_html(self) -> str:
        color = {"failed": "#b00020", "stopped": "#a15c00", "finished": "#1b5e20"}.get(
            self.state, "#0d47a1")
        return f"<span style='color:{color}'>{html.escape(self.text())}</span>"

    def placement_html(self) -> str:
        rows = placement_table(self.workers)
        if not rows:
            return "<i>waiting for workers to start...</i>"
        failed = {e["rank"] for e in self.errors}
        head = "".join(f"<th>{c}</th>" for c in PLACEMENT_COLUMNS)
        body = "".join(
            f"<tr{' class=raytpu-err' if r['rank'] in failed else ''}>"
            + "".join(f"<td>{html.escape('' if r[c] is None else str(r[c]))}</td>"
                      for c in PLACEMENT_COLUMNS) + "</tr>" for r in rows)
        return f"{STYLE}<div class='raytpu-dash'><table><tr>{head}</tr>{body}</table></div>"

    def restarts_html(self) -> str:
        """The run's attempts when Ray Train restarted it (``""`` without a restart): per attempt
        its slices, how it ended, the cause (which rank, host and slice failed) and the seconds
        lost."""
        r = self.result
        if r is None or not r.restarts:
            return ""
        head = "".join(f"<th>{c}</th>" for c in
                       ("attempt", "slices", "from s", "to s", "outcome", "cause", "lost s"))
        body = "".join(
            f"<tr{' class=raytpu-err' if a['outcome'] == 'restarted' else ''}>" + "".join(
                f"<td>{html.escape('' if v is None else str(v))}</td>" for v in (
                    a["attempt"], ", ".join(a["slices"]), a["started_s"], a["ended_s"],
                    a["outcome"], a["cause"], a["lost_s"])) + "</tr>"
            for a in r.attempts())
        return (f"{STYLE}<div class='raytpu-dash raytpu-restarts'><b>Restarts</b> "
                f"({len(r.restarts)})<table><tr>{head}</tr>{body}</table></div>")

    def restart_text(self) -> str:
        """The restarts as text lines (``""`` without one)."""
        return "\n".join(restart_lines(self.result.attempts())) if self.result is not None else ""

    def errors_html(self) -> str:
        parts = []
        for e in sorted(self.errors, key=lambda e: e["rank"]):
            where = f"rank {e['rank']} on host {e.get('host')}"
            if e.get("slice"):
                where += f" ({e['slice']} worker {e.get('worker_id')})"
            parts.append(f"<details open><summary class='raytpu-err'>{html.escape(where)} raised "
                         f"{html.escape(e['error'])}</summary>{pre_text(e['traceback'])}</details>")
        return f"{STYLE}<div class='raytpu-dash'>{''.join(parts)}</div>"

    def summary_html(self) -> str:
        r = self.result
        if r is None or not self.ended:
            return ""
        s = r.summary()
        rows: list[tuple[str, Any]] = [
            ("state", self.state), ("wall time", f"{s['wall_s']} s"), (s["counts"], s["steps"]),
            (f"{s['counts']}/s", s["steps_per_s"]), ("final metrics", s["final_metrics"]),
            ("slices", ", ".join(s["slices"])), ("restarts", s.get("restarts", 0)),
            ("storage (checkpoints, results, traces)", s["storage_path"] or "-")]
        goodput = r.goodput()
        rows.append(("goodput", goodput.text()))
        rows.append(("MFU", r.mfu().text()))
        if r.error:
            rows.append(("error", r.error.splitlines()[0]))
        body = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
                       for k, v in rows)
        bar = svg_img(render_goodput_svg(goodput), "goodput: where the wall time went")
        return (f"{STYLE}<div class='raytpu-dash'><b>Summary</b><table>{body}</table>"
                f"<div class='raytpu-goodput'>{bar}</div></div>")

    # -- static chart --------------------------------------------------------------------------

    def base_figure(self) -> go.Figure:
        fig = make_subplots(rows=1, cols=3, subplot_titles=(self.key, *(_TITLES[k] for k in _FIXED)))
        fig.update_layout(title=self.title, height=370, margin={"t": 90, "b": 80, "l": 50, "r": 20},
                          legend={"orientation": "h", "y": -0.32})
        fig.update_xaxes(title_text=self.xlabel())
        return fig

    def static_figure(self, max_points: int = STATIC_POINTS) -> go.Figure:
        """The charts as a plain plotly figure; a dropdown (plotly's own) picks the metric.

        Args:
            max_points: Points in all traces together (each trace keeps at most 2,000).
        """
        fig = self.base_figure()
        rows = self.rows()
        ranks = sorted(rows)
        all_rows = [r for rs in rows.values() for r in rs]
        keys = [k for k in numeric_keys(all_rows) if k not in (*_FIXED, "step")] or [self.key]
        first = self.key if self.key in keys else keys[0]
        per_trace = max(20, min(2000, max_points // max(1, len(ranks) * (len(keys) + 2))))
        for key in keys:
            for rank, (x, y) in self.series(key, per_trace).items():
                fig.add_trace(go.Scatter(x=_short(x), y=_short(y), mode="lines",
                                         name=f"rank {rank}", legendgroup=f"rank {rank}",
                                         visible=key == first, showlegend=True, meta=key,
                                         line={"color": PALETTE[rank % len(PALETTE)]}),
                              row=1, col=1)
        for col, key in enumerate(_FIXED, start=2):
            for rank, (x, y) in self.series(key, per_trace).items():
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
                                "args": [{"visible": visible}, {"annotations[0].text": key}]})
            # left of the title row, above the subplot titles: it covers no label
            fig.update_layout(updatemenus=[{"buttons": buttons, "x": 1.0, "y": 1.2,
                                            "xanchor": "right", "yanchor": "bottom",
                                            "active": keys.index(first)}])
        return fig

    def static_svg(self) -> str:
        """The chart as an SVG image (the chosen metric, step time, throughput; every rank)."""
        key = self.key if any(self.series(self.key, 2).values()) else next(
            (k for k in numeric_keys([r for rows in self.rows().values() for r in rows])
             if k not in _FIXED), self.key)
        panels = [(k if k == key else _TITLES.get(k, k), self.series(k, _SVG_POINTS))
                  for k in (key, *_FIXED)]
        return render_chart_svg(self.text(), panels, xlabel=self.xlabel())

    def static_chart_bundle(self) -> dict[str, Any]:
        """``{plotly JSON, image/svg+xml, text/plain}`` of the chart: small, safe, no script."""
        fig = json.loads(self.static_figure().to_json())
        fig.get("layout", {}).pop("template", None)  # ~10 KB of styling plotly.js has anyway
        fig["config"] = {"displaylogo": False, "responsive": True}
        return {PLOTLY_MIME: fig, "image/svg+xml": self.static_svg(), "text/plain": self.text()}

    def static_html(self, *, chart: bool = True) -> str:
        """Everything as one script-free HTML fragment; the chart (if ``chart``) as an ``<img>``
        of :meth:`static_svg` (JupyterLab's sanitizer keeps it in untrusted notebooks)."""
        parts = [STYLE, "<div class='raytpu-dash'>", f"<div><b>{html.escape(self.text())}</b></div>"]
        if self.errors:
            parts.append(self.errors_html())
        if chart and self.rows():
            parts.append(svg_img(self.static_svg(), "metrics of every rank"))
        parts += [self.restarts_html(), "<b>Placement</b>", self.placement_html(),
                  self.summary_html(),
                  "<b>Logs</b> (last lines per rank)"]
        for rank in self.logs.ranks:
            parts.append(f"<details><summary>{html.escape(self.log_title(rank))}</summary>"
                         f"{pre_lines(self.log_tail(rank))}</details>")
        parts.append("</div>")
        return "".join(parts)


def _short(values: list[float]) -> list[float]:
    """6 significant digits: the saved JSON stays small."""
    return [v if v == int(v) else float(f"{v:.6g}") for v in values]


def pre_lines(lines: list[tuple[str, str]]) -> str:
    """``(stream, text)`` lines as a ``<pre>``, stderr in red."""
    return "<pre>" + "\n".join(
        f"<span class='raytpu-err'>{html.escape(t)}</span>" if s == "stderr" else html.escape(t)
        for s, t in lines) + "</pre>"


def pre_text(text: str) -> str:
    return f"<pre>{html.escape(text)}</pre>"
