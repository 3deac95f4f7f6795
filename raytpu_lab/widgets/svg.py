"""Static renderings of a :class:`~raytpu_lab.state.model.ClusterSnapshot`: SVG map, HTML, text.

Pure (stdlib only): what exported notebooks, nbviewer, GitHub and a broken widget manager show.

- :func:`render_svg` draws each slice as its physical host grid (hosts at
  :meth:`SliceShape.host_coords`, chips at :meth:`SliceShape.chip_coords`; the z-planes of a 3-D
  topology side by side), chips coloured by state, with a legend. Slices of more than
  :data:`MAX_HOSTS_WITH_CHIPS` hosts are drawn as hosts only. Slices wrap into rows. A slice whose
  labels name no shape in the tables (:class:`~raytpu_lab.tpu.unknown.UnknownShape`) is drawn on
  that shape's schematic grid, its reason ("unknown TPU shape ...") under its title.
- :func:`render_status_html`: a status table followed by the SVG as an ``<img>`` (a data URI:
  JupyterLab's sanitizer drops inline ``<svg>`` from untrusted notebooks but keeps that), or
  inline (``inline_svg=True``, e.g. for an exported page, where hover titles then work).
- :func:`svg_img`: any SVG as such an ``<img>``; :func:`inline_svg_imgs` turns them back.
- :func:`render_status_text`: the same table as plain text (``text/plain``).

The SVG is self-contained: presentation attributes only (no CSS, fonts, scripts or links), so
inlining it in a page never restyles anything else. Every string from the cluster is escaped.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Mapping, Sequence
from html import escape

from raytpu_lab.state.snapshot import ClusterSnapshot, HostState, SliceState

__all__ = [
    "STATE_COLORS",
    "MAX_HOSTS_WITH_CHIPS",
    "slice_title",
    "chip_holder_lines",
    "render_svg",
    "render_status_html",
    "render_status_text",
    "svg_img",
    "inline_svg_imgs",
]

STATE_COLORS: dict[str, str] = {
    "free": "#34a853",
    "reserved": "#4285f4",
    "busy": "#f9ab00",
    "dead": "#d93025",
    "missing": "#bdc1c6",
    "provisioning": "#e8eaed",
}
"""Fill colour of a chip (or a host, when drawn without chips) per state."""
MAX_HOSTS_WITH_CHIPS = 64
"""Slices with more hosts are drawn as hosts only."""

_HIGHLIGHT = "#a142f4"
_DEGRADED = "#d93025"
_MAX_WIDTH_PX = 980
_CHIP, _CHIP_GAP, _HOST_PAD, _HOST_LABEL, _HOST_GAP = 16, 3, 4, 11, 10
_CELL, _CELL_GAP = 10, 2  # hosts-only mode
_PAD, _TITLE_H, _LINE_H, _PLANE_GAP, _PANEL_GAP = 10, 18, 14, 16, 12
_CHAR_PX = 6.4  # average width of an 11 px sans-serif character
_TITLE_CHAR_PX = 7.6  # ... of a 12 px bold one


def _e(text: object) -> str:
    return escape(str(text), quote=True)


def _text_px(text: str, char_px: float = _CHAR_PX) -> float:
    return len(text) * char_px


def slice_title(s: SliceState) -> str:
    """``"tpu-v6e-4x4-0 · v6e-16 · 4x4 · 4/4 hosts · reserved by a"`` (unescaped)."""
    parts = [s.name, s.pod_type, s.topology, f"{s.hosts_alive}/{s.hosts_expected} hosts"]
    state = s.state
    if state == "partial":
        parts.append(f"partial ({s.chips_free}/{s.chips_total} chips free)")
    elif state != "reserved":
        parts.append(state)
    if s.owners:
        parts.append("reserved by " + ", ".join(s.owners))
    elif s.head_locked:
        parts.append("head locked")
    return " · ".join(parts)


def _host_tooltip(s: SliceState, h: HostState) -> str:
    bits = [f"{s.name} worker {h.worker_id}" + (" (head)" if h.worker_id == 0 else ""),
            f"node {h.node_id or '-'}", f"IP {h.ip or '-'}", f"state {h.state}",
            f"chips {h.chips_free} free / {h.chips}"]
    if h.owner:
        bits.append(f"owner {h.owner}")
    if h.worker_id == 0 and s.head_locked:
        bits.append("head locked")
    bits.extend(chip_holder_lines(h))
    return "\n".join(bits)


def chip_holder_lines(h: HostState) -> list[str]:
    """``["chip 0: Holder 'a' (job 01000000, pid 8090)", "chips 1,2: ..."]``: each holder of
    the host's chips with its Ray chip ids, in chip id order; ``[]`` when none is known."""
    by_holder: dict[str, list[int]] = {}
    for chip, who in enumerate(h.chip_holders):
        if who:
            by_holder.setdefault(who, []).append(chip)
    return [f"chip{'s' if len(ids) > 1 else ''} {','.join(map(str, ids))}: {who}"
            for who, ids in by_holder.items()]


def _layout(s: SliceState) -> tuple[bool, float, float, int]:
    """``(with_chips, host_w, host_h, planes_per_row)`` for a slice."""
    shape = s.shape
    with_chips = shape.num_hosts <= MAX_HOSTS_WITH_CHIPS
    if with_chips:
        bx, by = shape.chips_per_host_bounds[:2]
        host_w = 2 * _HOST_PAD + bx * _CHIP + (bx - 1) * _CHIP_GAP
        host_h = 2 * _HOST_PAD + _HOST_LABEL + by * _CHIP + (by - 1) * _CHIP_GAP
    else:
        host_w = host_h = _CELL
    gap = _HOST_GAP if with_chips else _CELL_GAP
    hx = shape.host_grid[0]
    plane_w = hx * host_w + (hx - 1) * gap
    planes = shape.host_grid[2] if len(shape.host_grid) == 3 else 1
    per_row = max(1, min(planes, int((_MAX_WIDTH_PX - 2 * _PAD + _PLANE_GAP)
                                     // (plane_w + _PLANE_GAP))))
    return with_chips, host_w, host_h, per_row


def _host_svg(s: SliceState, h: HostState, x: float, y: float, w: float, hh: float,
              with_chips: bool, heat: tuple[str, str] | None = None) -> list[str]:
    color = STATE_COLORS.get(h.state, "#000")
    dash = ' stroke-dasharray="3 2"' if h.state in ("missing", "dead", "provisioning") else ""
    tip = _host_tooltip(s, h) + (f"\n{heat[1]}" if heat else "")
    mark = f' data-heat="{_e(heat[0])}"' if heat else ""
    head = (f'<g class="host" data-slice="{_e(s.name)}" data-worker="{h.worker_id}" '
            f'data-state="{_e(h.state)}"{mark}><title>{_e(tip)}</title>')
    if not with_chips:
        fill = _e(heat[0]) if heat else color
        return [head, f'<rect x="{x}" y="{y}" width="{w}" height="{hh}" fill="{fill}"'
                      f' stroke="#5f6368" stroke-width="0.5"{dash}/></g>']
    background = _e(heat[0]) if heat else "#f8f9fa"
    out = [head, f'<rect x="{x}" y="{y}" width="{w}" height="{hh}" rx="3" fill="{background}" '
                 f'stroke="{color}" stroke-width="1.5"{dash}/>',
           f'<text x="{x + w / 2}" y="{y + hh - 4}" text-anchor="middle" font-size="9" '
           f'fill="#3c4043">w{h.worker_id}</text>']
    shape = s.shape
    bx, by = shape.chips_per_host_bounds[:2]
    hc = shape.host_coords(h.worker_id)
    holders = h.chip_holders
    for chip, (coord, state) in enumerate(zip(shape.chip_coords(h.worker_id), h.chip_states(),
                                              strict=False)):
        cx, cy = coord[0] - hc[0] * bx, coord[1] - hc[1] * by
        px = x + _HOST_PAD + cx * (_CHIP + _CHIP_GAP)
        py = y + _HOST_PAD + cy * (_CHIP + _CHIP_GAP)
        rect = (f'<rect class="chip" data-state="{_e(state)}" x="{px}" y="{py}" '
                f'width="{_CHIP}" height="{_CHIP}" rx="2" fill="{STATE_COLORS.get(state, "#000")}"')
        who = holders[chip] if chip < len(holders) else ""
        out.append(f'{rect} data-holder="{_e(who)}" stroke="#202124" stroke-width="2">'
                   f'<title>chip {chip}: {_e(who)}</title></rect>' if who else rect + "/>")
    out.append("</g>")
    return out


def _slice_panel(s: SliceState, highlighted: bool,
                 heat: Mapping[tuple[str, int], tuple[str, str]] | None = None
                 ) -> tuple[float, float, list[str]]:
    """Draw one slice at the origin; return ``(width, height, svg elements)``."""
    shape = s.shape
    with_chips, host_w, host_h, per_row = _layout(s)
    gap = _HOST_GAP if with_chips else _CELL_GAP
    grid = shape.host_grid
    hx, hy = grid[0], grid[1]
    planes = grid[2] if len(grid) == 3 else 1
    plane_w = hx * host_w + (hx - 1) * gap
    plane_label = _LINE_H if planes > 1 else 0
    plane_h = plane_label + hy * host_h + (hy - 1) * gap
    title = slice_title(s)
    reasons = "; ".join(s.reasons)
    top = _PAD + _TITLE_H + (_LINE_H if reasons else 0)
    rows = -(-planes // per_row)
    grid_w = per_row * plane_w + (per_row - 1) * _PLANE_GAP
    width = 2 * _PAD + max(grid_w, _text_px(title, _TITLE_CHAR_PX), min(_text_px(reasons), _MAX_WIDTH_PX))
    height = top + rows * plane_h + (rows - 1) * _PLANE_GAP + _PAD
    body = [f'<g class="slice" data-slice="{_e(s.name)}" data-state="{_e(s.state)}">',
            f'<rect x="0" y="0" width="{width}" height="{height}" rx="6" fill="#ffffff" '
            f'stroke="#dadce0" stroke-width="1"/>',
            f'<text x="{_PAD}" y="{_PAD + 11}" font-size="12" font-weight="bold" '
            f'fill="#202124">{_e(title)}</text>']
    if highlighted:
        body.insert(1, f'<rect class="highlight" x="-3" y="-3" width="{width + 6}" '
                       f'height="{height + 6}" rx="8" fill="none" stroke="{_HIGHLIGHT}" '
                       f'stroke-width="3"/>')
    if reasons:
        body.append(f'<text x="{_PAD}" y="{_PAD + _TITLE_H + 10}" fill="{_DEGRADED}">'
                    f'{_e(reasons)}</text>')
    for z in range(planes):
        ox = _PAD + (z % per_row) * (plane_w + _PLANE_GAP)
        oy = top + (z // per_row) * (plane_h + _PLANE_GAP)
        if plane_label:
            body.append(f'<text x="{ox}" y="{oy + 10}" font-size="10" fill="#5f6368">z={z}</text>')
        for h in s.hosts:
            c = shape.host_coords(h.worker_id)
            if (c[2] if len(c) == 3 else 0) != z:
                continue
            x = ox + c[0] * (host_w + gap)
            y = oy + plane_label + c[1] * (host_h + gap)
            body.extend(_host_svg(s, h, x, y, host_w, host_h, with_chips,
                                  (heat or {}).get((s.name, h.worker_id))))
    body.append("</g>")
    return width, height, body


def _legend(y: float) -> tuple[float, list[str]]:
    out, x = [], float(_PAD)
    for state, color in STATE_COLORS.items():
        out.append(f'<rect class="legend" data-state="{state}" x="{x}" y="{y}" width="10" '
                   f'height="10" rx="2" fill="{color}"/>')
        out.append(f'<text x="{x + 14}" y="{y + 9}" fill="#3c4043">{state}</text>')
        x += 14 + _text_px(state) + 14
    return x, out


def _dcn_links(boxes: dict[str, tuple[float, float, float, float]],
               dcn: Iterable[Sequence[str]]) -> list[str]:
    """A dashed line badged "DCN" between consecutive slices of each multi-slice group."""
    out = []
    for group in dcn:
        drawn = [name for name in group if name in boxes]
        for a, b in zip(drawn, drawn[1:], strict=False):
            ax, ay, aw, ah = boxes[a]
            bx, by, bw, bh = boxes[b]
            if abs(ay - by) < 1:  # same row: right edge of a to left edge of b
                x1, y1, x2, y2 = ax + aw, ay + ah / 2, bx, by + bh / 2
            else:  # next row: bottom of a to top of b
                x1, y1, x2, y2 = ax + aw / 2, ay + ah, bx + bw / 2, by
            mx, my = (x1 + x2) / 2, (y1 + y2) / 2
            out.append(f'<g class="dcn-link" data-from="{_e(a)}" data-to="{_e(b)}">'
                       f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="{_HIGHLIGHT}" '
                       f'stroke-width="2" stroke-dasharray="4 3"/>'
                       f'<rect x="{mx - 16}" y="{my - 8}" width="32" height="16" rx="8" '
                       f'fill="{_HIGHLIGHT}"/><text x="{mx}" y="{my + 4}" text-anchor="middle" '
                       f'font-size="10" font-weight="bold" fill="#ffffff">DCN</text>'
                       f"<title>{_e(a)} and {_e(b)} are joined by DCN (data-center network), "
                       f"not ICI</title></g>")
    return out


def render_svg(snapshot: ClusterSnapshot, *, highlight: Iterable[str] | None = None,
               dcn: Iterable[Sequence[str]] = (),
               host_heat: Mapping[tuple[str, int], tuple[str, str]] | None = None) -> str:
    """The cluster map as one self-contained SVG document.

    Args:
        snapshot: What to draw.
        highlight: Slice names to ring (e.g. the slices a reservation holds).
        dcn: Multi-slice groups, each the slice names of one run in ``MEGASCALE_SLICE_ID``
            order; consecutive slices of a group get a dashed link badged "DCN"
            (``<g class="dcn-link" data-from data-to>``): the slices talk over the data-center
            network, not ICI.
        host_heat: ``{(slice name, worker id): (colour, note)}``: fill those hosts with the colour
            and add the note to their tooltip (``data-heat`` on the host), e.g. a profile's skew.

    Returns:
        ``<svg xmlns=...>...</svg>``; hosts are ``<g class="host" data-slice data-worker
        data-state>`` with a ``<title>`` tooltip, chips ``<rect class="chip" data-state>``.
    """
    marked = set(highlight or ())
    legend_w, body = _legend(_PAD)
    x, y, row_h, width = float(_PAD), _PAD + 24.0, 0.0, legend_w
    boxes: dict[str, tuple[float, float, float, float]] = {}
    for s in snapshot.slices:
        w, h, panel = _slice_panel(s, s.name in marked, host_heat)
        if x > _PAD and x + w > _MAX_WIDTH_PX:
            x, y, row_h = float(_PAD), y + row_h + _PANEL_GAP, 0.0
        boxes[s.name] = (x, y, w, h)
        body.append(f'<g transform="translate({x},{y})">')
        body.extend(panel)
        body.append("</g>")
        x += w + _PANEL_GAP
        row_h, width = max(row_h, h), max(width, x)
    body.extend(_dcn_links(boxes, dcn))
    y += row_h + (_PANEL_GAP if snapshot.slices else 0)
    notes = [] if snapshot.slices else ["No TPU slices in this cluster."]
    if snapshot.other_nodes:
        n = len(snapshot.other_nodes)
        notes.append(f"{n} other node{'s' if n != 1 else ''} (no slice host)")
    if snapshot.pending_owners:
        notes.append("waiting for placement: " + ", ".join(snapshot.pending_owners))
    for note in notes:
        body.append(f'<text x="{_PAD}" y="{y + 11}" fill="#5f6368">{_e(note)}</text>')
        y += _LINE_H
        width = max(width, _PAD + _text_px(note))
    width, height = round(width + _PAD), round(y + _PAD)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11" '
            f'role="img" aria-label="TPU slices">' + "".join(body) + "</svg>")


def _rows(snapshot: ClusterSnapshot) -> list[list[str]]:
    return [[s.name, s.pod_type, s.topology, f"{s.hosts_alive}/{s.hosts_expected}",
             f"{s.chips_free}/{s.chips_total}",
             s.state + (": " + "; ".join(s.reasons) if s.reasons else ""),
             ", ".join(s.owners) or ("head locked" if s.head_locked else "-")]
            for s in snapshot.slices]


_HEADER = ["slice", "pod type", "topology", "hosts alive/expected", "chips free/total", "state",
           "owner"]


def svg_img(svg: str, alt: str) -> str:
    """``svg`` as an ``<img>`` with a base64 data URI (survives HTML sanitizers; no script)."""
    data = base64.b64encode(svg.encode("utf-8")).decode("ascii")
    return f'<img class="raytpu-svg" alt="{_e(alt)}" src="data:image/svg+xml;base64,{data}"/>'


_IMG_RE = re.compile(r'<img class="raytpu-svg" alt="[^"]*" src="data:image/svg\+xml;base64,'
                     r'([A-Za-z0-9+/=]+)"/>')


def inline_svg_imgs(html: str) -> str:
    """Replace every :func:`svg_img` in ``html`` by the SVG itself (for trusted pages)."""
    return _IMG_RE.sub(lambda m: base64.b64decode(m.group(1)).decode("utf-8"), html)


def render_status_html(snapshot: ClusterSnapshot, highlight: Iterable[str] | None = None,
                       dcn: Iterable[Sequence[str]] = (), *, inline_svg: bool = False) -> str:
    """A status table (one row per slice) followed by :func:`render_svg`, as an HTML fragment.

    Args:
        snapshot: What to show.
        highlight: Slice names to ring.
        dcn: Multi-slice groups to join with a DCN link.
        inline_svg: Inline ``<svg>`` rather than an ``<img>`` (see module doc).
    """
    cell = 'style="padding:2px 10px;text-align:left;border-bottom:1px solid #dadce0"'
    head = "".join(f"<th {cell}>{_e(h)}</th>" for h in _HEADER)
    body = []
    for s, row in zip(snapshot.slices, _rows(snapshot), strict=True):
        dot = (f'<span style="color:{STATE_COLORS.get(s.state, _DEGRADED)}">&#9679;</span> '
               if s.state != "partial" else "")
        cells = [f"<td {cell}>{_e(v)}</td>" for v in row]
        cells[5] = f"<td {cell}>{dot}{_e(row[5])}</td>"
        body.append("<tr>" + "".join(cells) + "</tr>")
    if not body:
        body.append(f'<tr><td {cell} colspan="{len(_HEADER)}">No TPU slices.</td></tr>')
    table = (f'<table style="border-collapse:collapse;font-family:sans-serif;font-size:12px">'
             f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")
    svg = render_svg(snapshot, highlight=highlight, dcn=dcn)
    picture = svg if inline_svg else svg_img(svg, "map of the TPU slices")
    return (f'<div class="raytpu-status">{table}<div style="margin-top:8px">'
            f"{picture}</div></div>")


def render_status_text(snapshot: ClusterSnapshot) -> str:
    """The status table as aligned plain text, plus a line about other nodes."""
    rows = [_HEADER, *_rows(snapshot)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_HEADER))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if not snapshot.slices:
        lines.append("(no TPU slices)")
    lines.append(f"chips free {snapshot.free_chips}/{snapshot.total_chips}; "
                 f"{len(snapshot.other_nodes)} other node(s)")
    if snapshot.pending_owners:
        lines.append("waiting for placement: " + ", ".join(snapshot.pending_owners))
    held = [(s, h) for s in snapshot.slices for h in s.hosts if h.chip_holders]
    if held:
        lines.append("chips held (by Ray chip id):")
        lines.extend(f"  {s.name} w{h.worker_id} {line}" for s, h in held
                     for line in chip_holder_lines(h))
    return "\n".join(lines)
