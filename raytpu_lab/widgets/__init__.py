"""Views of the cluster snapshot; the static renderings here are pure (no Ray, no IPython).

:mod:`raytpu_lab.widgets.svg` draws a :class:`~raytpu_lab.state.model.ClusterSnapshot` as a
self-contained SVG map, an HTML status table and a plain-text table.
"""

from __future__ import annotations

from raytpu_lab.widgets.svg import (
    MAX_HOSTS_WITH_CHIPS,
    STATE_COLORS,
    render_status_html,
    render_status_text,
    render_svg,
    slice_title,
)

__all__ = [
    "MAX_HOSTS_WITH_CHIPS",
    "STATE_COLORS",
    "render_status_html",
    "render_status_text",
    "render_svg",
    "slice_title",
]
