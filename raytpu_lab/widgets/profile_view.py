"""The profile of a run, shown inline after it: step-time breakdown and skew per host, top XLA
ops, recompilations, and how to open the traces in XProf.

Static (no kernel needed once drawn), shown as two outputs (:meth:`ProfileView._ipython_display_`):
one plotly figure (stacked bars of compile / execute / report / host time per host, and a host x
step skew heatmap) as ``application/vnd.plotly.v1+json`` (no plotly.js in the notebook), then
script-free HTML (the skew map as an ``<img>``, two tables) with a ``text/plain`` summary for
terminals and logs. Pure of Ray.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from raytpu_lab.state.snapshot import ClusterSnapshot
from raytpu_lab.train.profile_analysis import ProfileReport
from raytpu_lab.widgets.svg import render_svg, svg_img

__all__ = ["ProfileView", "PARTS"]

PARTS = (("compile_s", "compile", "#d93025"), ("execute_s", "execute (XLA ops)", "#1a73e8"),
         ("report_s", "waiting in ray.train.report", "#bdc1c6"),
         ("host_s", "host: Python, input data", "#f9ab00"))
"""Breakdown parts: (field, legend, colour)."""


class ProfileView:
    """Display of a :class:`~raytpu_lab.train.profile_analysis.ProfileReport`.

    Example::

        report = load_profile(run.storage_path, (5, 8))
        display(ProfileView(report))
    """

    def __init__(self, report: ProfileReport, snapshot: ClusterSnapshot | None = None) -> None:
        self.report = report
        self.snapshot = snapshot

    def skew_map(self) -> str:
        """The topology map (static SVG) of the run's slices, hosts filled by their skew: white
        for a host never slower than the median, deepening red up to the straggler; ``""``
        without a snapshot."""
        if self.snapshot is None or not self.report.slots:
            return ""
        skew = self.report.host_skew_s()
        worst = max(skew.values(), default=0.0) or 1.0
        heat = {slot: (_red(v / worst), f"profile skew {v:.3f} s over the traced run")
                for slot, v in skew.items()}
        slices = {name for name, _ in skew}
        snap = ClusterSnapshot(self.snapshot.fetched_at, [s for s in self.snapshot.slices
                                                      if s.name in slices], [], None)
        return render_svg(snap, highlight=slices, host_heat=heat)

    def figure(self) -> go.Figure:
        """Per host: the traced steps' breakdown (stacked bars, seconds) and the skew heatmap
        (seconds more than the median host worked before each report)."""
        r = self.report
        fig = make_subplots(rows=1, cols=2, column_widths=[0.45, 0.55], horizontal_spacing=0.22,
                            subplot_titles=(f"traced steps {r.window[0]}:{r.window[1]}, per host (s)",
                                            "skew: work before report vs median host (s)"))
        totals = r.host_totals()
        hosts = [t["host"] for t in totals]
        for key, name, color in PARTS:
            fig.add_trace(go.Bar(y=hosts, x=[t[key] for t in totals], name=name, orientation="h",
                                 marker_color=color), row=1, col=1)
        if r.skew_s:
            fig.add_trace(go.Heatmap(z=r.skew_s, x=r.skew_steps, y=r.skew_hosts, colorscale="RdBu",
                                     reversescale=True, zmid=0, colorbar={"title": "s", "x": 1.02},
                                     hovertemplate="%{y}<br>step %{x}: %{z:.3f} s<extra></extra>"),
                          row=1, col=2)
        fig.update_layout(barmode="stack", height=140 + 22 * max(len(hosts), len(r.skew_hosts), 4),
                          margin={"t": 50, "b": 40, "l": 10, "r": 10},
                          legend={"orientation": "h", "y": -0.15})
        fig.update_xaxes(title_text="step", row=1, col=2)
        fig.update_yaxes(autorange="reversed")
        return fig

    def text(self) -> str:
        """A plain-text summary (``text/plain``)."""
        r = self.report
        lines = [f"Profile of steps {r.window[0]}:{r.window[1]} on {len(r.hosts)} hosts: {r.logdir}"]
        if r.message:
            lines.append(f"NOTE: {r.message}")
        for t in r.host_totals():
            parts = ", ".join(f"{label.split(' (')[0]} {t[k]:.3f}" for k, label, _ in PARTS)
            lines.append(f"  {t['host']}: {t['steps']} steps {t['step_s']:.3f} s = {parts}")
        straggler = r.straggler()
        if straggler:
            lines.append(f"Straggler: {straggler}")
        if r.ops:
            lines.append(f"Top XLA ops by self time ({r.ops_source}):")
            lines += [f"  {o.self_s * 1e3:9.3f} ms  x{o.occurrences:<5} {o.name} ({o.module})"
                      for o in r.ops]
        recompiled = [c for c in r.compiles if c.recompiles]
        lines.append("Recompilations: " + (", ".join(f"{c.fun_name} x{c.recompiles} (steps "
                                                     f"{', '.join(map(str, c.steps))})"
                                                     for c in recompiled) or "none"))
        lines.append(f"Open in XProf: {r.open_command}")
        return "\n".join(lines)

    def html(self) -> str:
        """Script-free HTML: straggler, skew map (an ``<img>``), op and compile tables, XProf line."""
        r = self.report
        head = ("<div class='raytpu-profile' style='font-family:sans-serif;font-size:12px'>"
                "<style>.raytpu-profile th,.raytpu-profile td{padding:2px 8px;text-align:left}"
                ".raytpu-profile caption{font-weight:bold;text-align:left}</style>"
                f"<b>Profile of steps {r.window[0]}:{r.window[1]}</b>"
                f" on {len(r.hosts)} hosts")
        if r.message:
            head += f"<div style='color:#d93025'>{escape(r.message)}</div>"
        straggler = r.straggler()
        if straggler:
            head += f"<div>Straggler: <b>{escape(straggler)}</b></div>"
        ops = "".join(f"<tr><td>{escape(o.name)}</td><td>{escape(o.module)}</td>"
                      f"<td style='text-align:right'>{o.occurrences}</td>"
                      f"<td style='text-align:right'>{o.self_s * 1e3:.3f}</td>"
                      f"<td style='text-align:right'>{o.total_s * 1e3:.3f}</td></tr>" for o in r.ops)
        comp = "".join(f"<tr><td>{escape(c.fun_name)}</td>"
                       f"<td style='text-align:right'>{c.compiles_per_rank}</td>"
                       f"<td style='text-align:right'>{c.recompiles}</td>"
                       f"<td>{', '.join(map(str, c.steps))}</td>"
                       f"<td style='text-align:right'>{c.total_s:.3f}</td></tr>" for c in r.compiles)
        tables = (
            f"<div style='display:flex;gap:24px;flex-wrap:wrap'>"
            f"<table class='raytpu-ops'><caption>Top XLA ops by self time, all hosts "
            f"({escape(r.ops_source)})</caption><tr><th>op</th><th>module</th><th>count</th>"
            f"<th>self ms</th><th>total ms</th></tr>{ops}</table>"
            f"<table class='raytpu-compiles'><caption>XLA compilations per rank (JAX compile log)"
            f"</caption><tr><th>function</th><th>compiles</th><th>recompiles</th><th>at steps</th>"
            f"<th>s</th></tr>{comp}</table></div>")
        one_liner = (f"<div>Open the traces in XProf: <code>{escape(r.open_command)}</code> "
                     f"(or <code>tensorboard --logdir {escape(r.logdir)}</code>)</div></div>")
        skew_map = self.skew_map()
        if skew_map:
            skew_map = (f"<div><div>Skew per host on the map (red: slower)</div>"
                        f"{svg_img(skew_map, 'skew per host')}</div>")
        return head + skew_map + tables + one_liner

    def figure_bundle(self) -> dict[str, object] | None:
        """The figure as plotly's mime bundle (``None`` when there is nothing to draw)."""
        r = self.report
        if not (r.breakdown or r.skew_s):
            return None
        fig = json.loads(self.figure().to_json())
        fig.get("layout", {}).pop("template", None)
        fig["config"] = {"displaylogo": False, "responsive": True}
        return {"application/vnd.plotly.v1+json": fig, "image/svg+xml": self.breakdown_svg(),
                "text/plain": f"profile of steps {r.window[0]}:{r.window[1]} (plotly chart)"}

    def breakdown_svg(self) -> str:
        """The per-host breakdown as stacked bars in one SVG document (seconds), the image that
        viewers without plotly's renderer (nbconvert, GitHub, VS Code) show for the figure."""
        totals = self.report.host_totals()
        longest = max((sum(float(t[key]) for key, _, _ in PARTS) for t in totals), default=0.0)
        scale = 300.0 / longest if longest > 0 else 0.0
        width, height = 480, 30 + 22 * len(totals)
        out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
               f'font-family="sans-serif" font-size="11"><text x="4" y="14">traced steps '
               f'{self.report.window[0]}:{self.report.window[1]}, per host (s); longest '
               f'{longest:.3f} s</text>']
        for row, t in enumerate(totals):
            y, x = 24 + 22 * row, 150.0
            out.append(f'<text x="4" y="{y + 13}">{escape(str(t["host"]))}</text>')
            for key, name, color in PARTS:
                w = float(t[key]) * scale
                if w > 0:
                    out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="16" '
                               f'fill="{color}"><title>{escape(name)}: {float(t[key]):.4f} s'
                               f'</title></rect>')
                    x += w
        out.append("</svg>")
        return "".join(out)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        fig = self.figure_bundle()
        if fig is not None:
            display(fig, raw=True)  # type: ignore[no-untyped-call]
        display(self._repr_mimebundle_(), raw=True)  # type: ignore[no-untyped-call]

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, str]:
        return {"text/plain": self.text(), "text/html": self.html()}


def _red(fraction: float) -> str:
    """White (0) to red (1)."""
    f = min(1.0, max(0.0, fraction))
    other = round(255 - f * (255 - 48))
    return f"#{255:02x}{other:02x}{other:02x}"
