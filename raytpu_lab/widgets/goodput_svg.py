"""The goodput bar: a run's wall time as one stacked horizontal bar, one colour per part. Pure.

Rendered from a :class:`~raytpu_lab.train.goodput.Goodput` as a small self-contained SVG (no
script, no external reference), shown in the run dashboard's summary and its static copy.
"""

from __future__ import annotations

from html import escape

from raytpu_lab.train.goodput import GOODPUT_PARTS, Goodput

__all__ = ["PART_COLOURS", "render_goodput_svg"]

PART_COLOURS = dict(zip(GOODPUT_PARTS, (
    "#9aa4b1",  # waiting for slices
    "#c9a227",  # worker start-up
    "#e07b39",  # distributed init
    "#b55dcd",  # first step (compile)
    "#2da44e",  # steps (goodput)
    "#4c8ed9",  # report
    "#1f4e8c",  # checkpointing
    "#d0d7de",  # other
), strict=True))
"""One colour per part; the productive ``steps`` in green."""


def render_goodput_svg(goodput: Goodput, *, width: int = 560) -> str:
    """The bar (``width`` px wide, 24 px high) and a legend of the non-zero parts below it.

    Each segment is a ``<rect class="goodput-part" data-part=... data-seconds=...>`` as wide as
    its share of the wall time, with a ``<title>`` giving the part and its seconds.

    Returns:
        An ``<svg>`` element as text.
    """
    wall = goodput.wall_s if goodput.wall_s > 0 else 1.0
    x, rects, legend = 0.0, [], []
    shown = [(k, v) for k, v in goodput.parts.items() if v > 0]
    for part, seconds in shown:
        w = width * seconds / wall
        rects.append(f'<rect class="goodput-part" data-part="{escape(part)}" data-seconds="{seconds:.3f}" '
                     f'x="{x:.2f}" y="0" width="{max(w, 0.5):.2f}" height="24" fill="{PART_COLOURS[part]}">'
                     f"<title>{escape(part)}: {seconds:.2f} s ({seconds / wall:.0%})</title></rect>")
        x += w
    for i, (part, seconds) in enumerate(shown):
        col, row = i % 3, i // 3
        lx, ly = col * (width / 3), 40 + row * 16
        legend.append(f'<rect x="{lx:.0f}" y="{ly - 9}" width="10" height="10" fill="{PART_COLOURS[part]}"/>'
                      f'<text x="{lx + 14:.0f}" y="{ly}" font-size="11">{escape(part)} '
                      f"{seconds:.1f} s ({seconds / wall:.0%})</text>")
    height = 40 + 16 * ((len(shown) + 2) // 3)
    title = f"goodput {goodput.fraction:.0%} of {goodput.wall_s:.1f} s"
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="raytpu-goodput" width="{width}" '
            f'height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif">'
            f"<title>{escape(title)}</title>{''.join(rects)}{''.join(legend)}</svg>")
