"""Pure: the request-load panel of a served app, as a small mime bundle (HTML with inline SVG).

Left: requests/s and errors per second, latency p50/p90/p99 over time (and, for streamed
answers, time to first chunk and inter-chunk latency); right: Serve's state of the app
(status, replicas running/target). The same bundle is shown live (updated each second through
one display id) and kept in the saved notebook: a few kB, no script, no plotly.js.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from raytpu_lab.serve.loadstats import LoadStats

__all__ = ["LoadPanel"]

_W, _H, _PAD = 320, 120, 28
_COLORS = {"p50": "#1f77b4", "p90": "#ff7f0e", "p99": "#d62728", "rps": "#2ca02c",
           "errors": "#d62728", "ttfc_p50": "#9467bd", "itl_p50": "#8c564b"}


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f} ms"


def _chart(title: str, rows: Sequence[Mapping[str, Any]], keys: Sequence[str], scale: float,
           unit: str) -> str:
    """One small SVG line chart of ``keys`` of ``rows`` against ``t`` (values times ``scale``)."""
    points = {k: [(float(r["t"]), float(r[k]) * scale) for r in rows if r.get(k) is not None]
              for k in keys}
    xs = [x for p in points.values() for x, _ in p] or [0.0]
    ys = [y for p in points.values() for _, y in p] or [0.0]
    x0, x1 = min(xs), max(max(xs), min(xs) + 1.0)
    y1 = max(max(ys), 1e-9) * 1.1

    def px(x: float, y: float) -> str:
        return (f"{_PAD + (x - x0) / (x1 - x0) * (_W - _PAD - 6):.1f},"
                f"{_H - 16 - y / y1 * (_H - 30):.1f}")

    lines = []
    for k, pts in points.items():
        if len(pts) == 1:
            pts = [pts[0], (pts[0][0] + 0.01, pts[0][1])]
        if pts:
            lines.append(f'<polyline class="series" data-key="{k}" fill="none" stroke-width="1.5" '
                         f'stroke="{_COLORS.get(k, "#333")}" points="{" ".join(px(x, y) for x, y in pts)}"/>')
    legend = " ".join(f'<tspan fill="{_COLORS.get(k, "#333")}">{html.escape(k)}</tspan>' for k in keys)
    return (f'<svg class="raytpu-serve-chart" width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" '
            f'xmlns="http://www.w3.org/2000/svg" style="font:10px sans-serif">'
            f'<text x="{_PAD}" y="10">{html.escape(title)} ({unit}) {legend}</text>'
            f'<line x1="{_PAD}" y1="{_H - 16}" x2="{_W - 6}" y2="{_H - 16}" stroke="#999"/>'
            f'<line x1="{_PAD}" y1="14" x2="{_PAD}" y2="{_H - 16}" stroke="#999"/>'
            f'<text x="2" y="20">{y1:.3g}</text><text x="{_PAD}" y="{_H - 3}">{x0:.0f} s</text>'
            f'<text x="{_W - 30}" y="{_H - 3}">{x1:.0f} s</text>{"".join(lines)}</svg>')


class LoadPanel:
    """The panel of one load against app ``app``.

    Args:
        app: The app's name.
        stats: The load's stats so far (or final).
        serve_state: :meth:`raytpu_lab.serve.service.ServeService.status` of the app, or ``None``.
        done: Whether the load finished.
    """

    def __init__(self, app: str, stats: LoadStats, serve_state: Mapping[str, Any] | None = None,
                 done: bool = False) -> None:
        self.app = app
        self.stats = stats
        self.serve_state = dict(serve_state or {})
        self.done = done

    def text(self) -> str:
        """One-paragraph plain text of the summary."""
        s = self.stats.summary()
        state = "finished" if self.done else "running"
        out = (f"load on {self.app} ({state}): {s['sent']} sent, {s['ok']} ok, {s['errors']} errors, "
               f"{s['achieved_rps']:.1f} req/s of {s['rps_target']:g} asked; latency p50 "
               f"{_ms(s['p50'])}, p90 {_ms(s['p90'])}, p99 {_ms(s['p99'])}")
        if s["streaming"]:
            out += f"; first chunk p50 {_ms(s['ttfc_p50'])}, inter-chunk p50 {_ms(s['itl_p50'])}"
        if s["first_error"]:
            out += f"; first error: {s['first_error']}"
        return out

    def html(self) -> str:
        """The panel as HTML with inline SVG (no script)."""
        rows = self.stats.windows()
        s = self.stats.summary()
        charts = [_chart("requests/s, errors", rows, ["rps", "errors"], 1.0, "per s"),
                  _chart("latency", rows, ["p50", "p90", "p99"], 1000.0, "ms")]
        if s["streaming"]:
            charts.append(_chart("streaming", rows, ["ttfc_p50", "itl_p50"], 1000.0, "ms"))
        st = self.serve_state
        deps = "".join(
            f"<tr><td>{html.escape(n)}</td><td>{html.escape(str(d.get('status', '')))}</td>"
            f"<td>{d.get('running', 0)}/{d.get('target', 0)}</td></tr>"
            for n, d in dict(st.get("deployments") or {}).items())
        serve = (f'<div class="raytpu-serve-state"><b>Serve: {html.escape(self.app)}</b> '
                 f'{html.escape(str(st.get("status", "?")))}<table><tr><th>deployment</th>'
                 f'<th>status</th><th>replicas running/target</th></tr>{deps}</table>'
                 f'<div>queued: not reported by Ray Serve 2.60 status</div></div>')
        return (f'<div class="raytpu-serve-panel" style="display:flex;gap:12px;flex-wrap:wrap">'
                f'<div>{"".join(charts)}<div class="raytpu-serve-summary">{html.escape(self.text())}'
                f'</div></div>{serve}</div>')

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.text(), "text/html": self.html()}
