"""The map's messages have the shapes declared in raytpu_lab._protocols, and the JS reads only those.

The Python side is checked by building real messages and comparing their keys and row lengths
with the TypedDicts; the JS side by reading topology_map.js for the fields it reads off each
message, the geometry trait and its slices, and the names it destructures rows into.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from raytpu_lab import _protocols as p
from raytpu_lab.state import build_snapshot
from raytpu_lab.state.synthetic import mark_busy, synthetic_raw_state
from raytpu_lab.widgets.topology_map import TopologyMap

JS = (Path(p.__file__).parent / "widgets" / "topology_map.js").read_text(encoding="utf-8")


def _keys(td: Any) -> set[str]:
    return set(td.__required_keys__) | set(td.__optional_keys__)


def _reads(var: str) -> set[str]:
    """Field names the JS reads off a variable, e.g. ``msg.rev`` -> ``{"rev", ...}``."""
    return set(re.findall(rf"\b{re.escape(var)}\.([A-Za-z_]+)", JS)) - {"length"}


def _destructured(source: str) -> list[tuple[str, ...]]:
    """Names of every ``const [a, b] = <source>`` / ``for (const [a, b] of <source>)``."""
    pattern = rf"const \[([^\]]*)\] (?:=|of) {re.escape(source)}(?![\w.\[])"
    return [tuple(n.strip() for n in m.split(",")) for m in re.findall(pattern, JS)]


@pytest.fixture
def widget_and_sent():
    m = TopologyMap(build_snapshot(synthetic_raw_state([("v6e:4x4", 2)])))
    sent: list[Any] = []
    m.send = lambda content, buffers=None: sent.append(content)  # type: ignore[method-assign]
    yield m, sent
    m.close()


def test_kernel_messages_have_the_declared_keys_and_row_widths(widget_and_sent) -> None:
    m, sent = widget_and_sent
    full = m._full_message()
    assert set(full) == _keys(p.FullMessage) and full["type"] == "full"
    assert all(len(r) == len(p.SLICE_ROW) for r in full["slices"])
    assert all(len(r) == len(p.HOST_ROW) for rows in full["hosts"] for r in rows)
    assert all(len(r) == len(p.NODE_ROW) for rows in full["nodes"] for r in rows)
    assert set(m.geometry) == _keys(p.Geometry)
    assert all(set(g) == _keys(p.SliceGeometry) for g in m.geometry["slices"])

    raw = mark_busy(synthetic_raw_state([("v6e:4x4", 2)]), 0.5, seed=3)
    raw["nodes"][1]["alive"] = False
    raw["nodes"][2]["ip"] = "10.9.9.9"
    m.update(build_snapshot(raw))
    (delta,) = sent
    assert set(delta) == _keys(p.DeltaMessage) and delta["type"] == "delta"
    assert delta["h"] and all(len(r) == 2 + len(p.HOST_ROW) for r in delta["h"])
    assert delta["n"] and all(len(r) == 2 + len(p.NODE_ROW) for r in delta["n"])
    assert delta["s"] and all(len(r) == 1 + len(p.SLICE_ROW) for r in delta["s"])
    json.dumps(delta)  # what the comm does with it

    sent.clear()
    m._on_view_msg(m, {"type": "details", "slice": m.geometry["slices"][0]["name"], "worker": 2}, [])
    (details,) = sent
    assert set(details) == _keys(p.DetailsMessage) and details["type"] == "details"


def test_row_cells_have_the_declared_types(widget_and_sent) -> None:
    m, _ = widget_and_sent
    full = m._full_message()
    for code, free, reserved, busy, owner, layout, holders in (r for rows in full["hosts"]
                                                              for r in rows):
        assert all(isinstance(x, int) for x in (code, free, reserved, busy))
        assert 0 <= code < len(m.geometry["states"]) and (owner is None or isinstance(owner, str))
        assert isinstance(layout, str) and set(layout) <= {"r", "b", "f"}
        assert isinstance(holders, list) and all(isinstance(x, str) for x in holders)
    for node_id, ip in (r for rows in full["nodes"] for r in rows):
        assert isinstance(node_id, str) and isinstance(ip, str)
    assert all(all(isinstance(x, str) for x in r) for r in full["slices"])


def test_js_reads_only_declared_fields() -> None:
    kernel_msgs = _keys(p.FullMessage) | _keys(p.DeltaMessage) | _keys(p.DetailsMessage)
    assert _reads("msg") and _reads("msg") <= kernel_msgs, _reads("msg") - kernel_msgs
    assert _reads("geometry") <= _keys(p.Geometry), _reads("geometry") - _keys(p.Geometry)
    slice_geo = _keys(p.SliceGeometry)
    assert _reads("g") and _reads("g") <= slice_geo, _reads("g") - slice_geo
    assert _reads("d") <= _keys(p.DetailsMessage)
    assert _reads("sel") <= _keys(p.Selected)
    # data holds the last full message (with deltas applied)
    assert _reads("data") <= _keys(p.FullMessage), _reads("data") - _keys(p.FullMessage)


def test_js_destructures_rows_with_the_declared_column_names() -> None:
    assert _destructured(r"data.hosts[si][w]") == [p.HOST_ROW]
    assert _destructured(r"data.nodes[si][w]") == [p.NODE_ROW]
    assert _destructured(r"data.slices[si]") == [p.SLICE_ROW]
    assert _destructured("msg.s")[0] == ("si", *p.SLICE_ROW)
    assert _destructured("row") == [p.HOST_ROW[:6]]  # chipStates needs no holders


def test_js_sends_only_declared_view_messages() -> None:
    sends = re.findall(r"model\.send\(\{([^}]*)\}\)", JS)
    view_keys = [_keys(td) for td in (p.RequestFull, p.DetailsRequest)]
    assert len(sends) == 2
    for body in sends:
        keys = set(re.findall(r"([A-Za-z_]+):", body))
        assert keys in view_keys, body
    for body in re.findall(r"select\(\{([^}]*)\}\)", JS):
        assert set(re.findall(r"([A-Za-z_]+):", body)) <= _keys(p.Selected), body
