"""Line charts as self-contained SVG: the static image of a run's metrics (pure, stdlib only).

:func:`render_chart_svg` draws side-by-side panels (e.g. the chosen metric, step time,
throughput), one polyline per rank, with axes, ticks and a rank legend. Presentation attributes
only (no CSS, scripts, fonts or links), every label escaped, coordinates rounded to 0.1 px, so the
image is small (a few tens of KB for 8 ranks x 3 panels x 300 points) and safe to inline.

The live chart (``run_chart.js``) draws the same layout in the browser; :data:`PALETTE` and
:func:`nice_ticks` are shared by both (the JS keeps a copy of each).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

__all__ = ["PALETTE", "nice_ticks", "render_chart_svg", "Series"]

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")
"""Rank ``r`` is drawn in ``PALETTE[r % 10]`` (plotly's default colours)."""

Series = Mapping[int, tuple[Sequence[float], Sequence[float]]]
"""One panel's data: ``{rank: (xs, ys)}``."""

_W, _PANEL_H, _GAP, _LEFT, _TOP, _BOTTOM = 960, 220, 24, 52, 40, 34
_LEGEND_MAX = 16


def nice_ticks(lo: float, hi: float, count: int = 4) -> list[float]:
    """About ``count`` round tick values covering ``[lo, hi]`` (1, 2 or 5 times a power of ten).

    Args:
        lo: Smallest value shown.
        hi: Largest value shown (``hi == lo`` gives one tick).
        count: Wanted number of intervals.

    Returns:
        Ascending ticks within ``[lo, hi]``.
    """
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else []
    raw = (hi - lo) / max(1, count)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    ticks: list[float] = []
    t = first
    while t <= hi + step * 1e-9 and len(ticks) < 20:
        ticks.append(round(t, 12))
        t += step
    return ticks


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e5 or a < 1e-3:
        return f"{v:.1e}"
    return f"{v:.4g}"


def _e(text: object) -> str:
    return escape(str(text), quote=True)


def _bounds(series: Series) -> tuple[float, float, float, float] | None:
    xs = [x for sx, _ in series.values() for x in sx]
    ys = [y for _, sy in series.values() for y in sy if math.isfinite(y)]
    if not xs or not ys:
        return None
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        pad = abs(y0) * 0.1 or 1.0
        y0, y1 = y0 - pad, y1 + pad
    return x0, x1, y0, y1


def _panel(title: str, series: Series, x: float, width: float, xlabel: str) -> list[str]:
    out = [f'<g class="panel" data-title="{_e(title)}" transform="translate({x:.1f},0)">',
           f'<text x="{width / 2:.1f}" y="{_TOP - 12}" text-anchor="middle" font-size="13" '
           f'font-weight="bold" fill="#202124">{_e(title)}</text>']
    plot_w, plot_h = width - _LEFT - 8, _PANEL_H - _TOP - _BOTTOM
    out.append(f'<rect x="{_LEFT}" y="{_TOP}" width="{plot_w:.1f}" height="{plot_h}" '
               f'fill="#fafafa" stroke="#dadce0"/>')
    b = _bounds(series)
    if b is None:
        out.append(f'<text x="{_LEFT + plot_w / 2:.1f}" y="{_TOP + plot_h / 2:.1f}" '
                   f'text-anchor="middle" font-size="11" fill="#5f6368">no data</text></g>')
        return out
    x0, x1, y0, y1 = b

    def px(v: float) -> float:
        return _LEFT + (v - x0) / (x1 - x0) * plot_w

    def py(v: float) -> float:
        return _TOP + plot_h - (v - y0) / (y1 - y0) * plot_h

    for t in nice_ticks(y0, y1):
        y = py(t)
        out.append(f'<line x1="{_LEFT}" x2="{_LEFT + plot_w:.1f}" y1="{y:.1f}" y2="{y:.1f}" '
                   f'stroke="#e8eaed"/><text x="{_LEFT - 4}" y="{y + 3:.1f}" text-anchor="end" '
                   f'font-size="10" fill="#5f6368">{_fmt(t)}</text>')
    for t in nice_ticks(x0, x1):
        xx = px(t)
        out.append(f'<text x="{xx:.1f}" y="{_TOP + plot_h + 13}" text-anchor="middle" '
                   f'font-size="10" fill="#5f6368">{_fmt(t)}</text>')
    out.append(f'<text x="{_LEFT + plot_w / 2:.1f}" y="{_PANEL_H - 4}" text-anchor="middle" '
               f'font-size="10" fill="#5f6368">{_e(xlabel)}</text>')
    for rank, (xs, ys) in sorted(series.items()):
        pts = [(px(a), py(c)) for a, c in zip(xs, ys, strict=False) if math.isfinite(c)]
        if not pts:
            continue
        d = "M" + " L".join(f"{a:.1f},{c:.1f}" for a, c in pts)
        color = PALETTE[rank % len(PALETTE)]
        out.append(f'<path class="trace" data-rank="{rank}" d="{d}" fill="none" '
                   f'stroke="{color}" stroke-width="1.5"/>')
        if len(pts) == 1:
            out.append(f'<circle cx="{pts[0][0]:.1f}" cy="{pts[0][1]:.1f}" r="2.5" '
                       f'fill="{color}"/>')
    out.append("</g>")
    return out


def render_chart_svg(title: str, panels: Sequence[tuple[str, Series]], *,
                     xlabel: str = "step") -> str:
    """Draw ``panels`` side by side as one SVG document.

    Args:
        title: Drawn above the panels (e.g. the run's name and state).
        panels: ``(panel title, {rank: (xs, ys)})`` per panel; non-finite y values are skipped.
        xlabel: The x axis' name (``step`` or ``report``).

    Returns:
        An ``<svg>`` element (UTF-8 text) 960 px wide.
    """
    n = max(1, len(panels))
    width = (_W - _GAP * (n - 1)) / n
    ranks = sorted({r for _, s in panels for r in s})
    legend_h = 18 if ranks else 0
    height = 22 + _PANEL_H + legend_h
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="raytpu-chart" width="{_W}" '
           f'height="{height}" viewBox="0 0 {_W} {height}" font-family="sans-serif">',
           f'<rect width="{_W}" height="{height}" fill="#fff"/>',
           f'<text x="4" y="15" font-size="13" fill="#202124">{_e(title)}</text>',
           '<g transform="translate(0,22)">']
    for i, (ptitle, series) in enumerate(panels):
        out += _panel(ptitle, series, i * (width + _GAP), width, xlabel)
    out.append("</g>")
    if ranks:
        y = 22 + _PANEL_H + 12
        x = float(_LEFT)
        for rank in ranks[:_LEGEND_MAX]:
            color = PALETTE[rank % len(PALETTE)]
            out.append(f'<line x1="{x:.0f}" x2="{x + 14:.0f}" y1="{y - 4}" y2="{y - 4}" '
                       f'stroke="{color}" stroke-width="2"/><text x="{x + 18:.0f}" y="{y}" '
                       f'font-size="11" fill="#202124">rank {rank}</text>')
            x += 70
        if len(ranks) > _LEGEND_MAX:
            out.append(f'<text x="{x:.0f}" y="{y}" font-size="11" fill="#5f6368">'
                       f'+{len(ranks) - _LEGEND_MAX} more ranks</text>')
    out.append("</svg>")
    return "".join(out)
