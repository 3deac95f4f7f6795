"""The live map widget's Python side: deltas, re-layout, highlight, display bundle, no leaked comms."""

from __future__ import annotations

import gc
import json
import re
from pathlib import Path
from typing import Any

import ipywidgets
import pytest

from raytpu_lab.state import ClusterSnapshot, build_snapshot
from raytpu_lab.state.synthetic import mark_busy, synthetic_raw_state
from raytpu_lab.widgets import topology_map
from raytpu_lab.widgets.svg import inline_svg_imgs
from raytpu_lab.widgets.topology_map import TopologyMap

FIXTURES = Path(__file__).parent / "fixtures"
S0, S1 = "tpu-v6e-4x4-0", "tpu-v6e-4x4-1"


def _raw(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"raw_v6e_4x4_x2_{name}.json").read_text())


def _snap(name: str) -> ClusterSnapshot:
    return build_snapshot(_raw(name))


def _capture(m: TopologyMap) -> list[dict[str, Any]]:
    """Collect what ``m`` sends as the view receives it: through JSON (rows are tuples here)."""
    sent: list[dict[str, Any]] = []
    m.send = lambda content, buffers=None: sent.append(  # type: ignore[method-assign]
        json.loads(json.dumps(content)))
    return sent


@pytest.fixture
def idle_map():
    m = TopologyMap(_snap("idle"))
    yield m
    m.close()


def test_construct_lays_out_slices_and_hosts(idle_map: TopologyMap) -> None:
    geo = idle_map.geometry
    assert [g["name"] for g in geo["slices"]] == [S0, S1]
    assert geo["slices"][0]["grid"] == [2, 2] and geo["slices"][0]["block"] == [2, 2]
    assert geo["slices"][0]["hosts"] == 4
    assert geo["states"] == ["free", "reserved", "busy", "dead", "missing", "provisioning"]
    full = idle_map._full_message()
    assert full["type"] == "full" and full["geometry_rev"] == geo["rev"]
    assert [len(rows) for rows in full["hosts"]] == [4, 4]
    assert all(row[0] == 0 and row[1] == 4 for rows in full["hosts"] for row in rows)


def test_empty_map_and_late_first_snapshot() -> None:
    m = TopologyMap()
    try:
        assert m.geometry["slices"] == [] and m.selected == {}
        sent = _capture(m)
        m.update(_snap("idle"))
        assert [g["name"] for g in m.geometry["slices"]] == [S0, S1]
        assert [msg["type"] for msg in sent] == ["full"]
    finally:
        m.close()


def test_unchanged_snapshot_sends_nothing(idle_map: TopologyMap) -> None:
    sent = _capture(idle_map)
    rev = idle_map.geometry["rev"]
    idle_map.update(_snap("idle"))
    idle_map.update(_snap("idle"))
    assert sent == []
    assert idle_map.geometry["rev"] == rev


def test_reservation_sends_small_delta(idle_map: TopologyMap) -> None:
    sent = _capture(idle_map)
    idle_map.update(_snap("one_reserved"))
    assert len(sent) == 1
    delta = sent[0]
    assert delta["type"] == "delta" and delta["rev"] == delta["base"] + 1
    assert sorted((r[0], r[1]) for r in delta["h"]) == [(0, 0), (0, 1), (0, 2), (0, 3)]
    assert all(r[2] == 1 and r[6] == "a" for r in delta["h"])  # code 1 = reserved, owner "a"
    assert [r[0] for r in delta["s"]] == [0] and delta["s"][0][2] == "reserved"
    assert delta["n"] == []
    assert len(json.dumps(delta)) < 600


def test_one_host_changed_sends_one_host() -> None:
    raw = synthetic_raw_state([("v6e:4x4", 3)])
    m = TopologyMap(build_snapshot(raw))
    try:
        sent = _capture(m)
        m.update(build_snapshot(mark_busy(raw, 1 / 12, seed=3)))
        assert len(sent) == 1
        (h,) = sent[0]["h"]
        assert h[2] == 2 and h[3] == 0  # busy, no chip free
        assert len(json.dumps(sent[0])) < 400
    finally:
        m.close()


def test_dead_host_and_new_node_id_travel_in_delta() -> None:
    raw = _raw("idle")
    m = TopologyMap(build_snapshot(raw))
    try:
        sent = _capture(m)
        node = next(n for n in raw["nodes"] if n["labels"].get("ray.io/tpu-worker-id") == "3"
                    and n["labels"].get("ray.io/tpu-slice-name") == S1)
        node["alive"] = False
        m.update(build_snapshot(raw))
        (delta,) = sent
        assert [r[:3] for r in delta["h"]] == [[1, 3, 3]]  # slice 1, worker 3, dead
        assert delta["s"][0][0] == 1 and delta["s"][0][2] == "degraded"
        node["alive"], node["node_id"] = True, "ab" * 28
        m.update(build_snapshot(raw))
        assert sent[1]["n"] == [[1, 3, "ab" * 28, node["ip"]]]
    finally:
        m.close()


def test_new_slice_triggers_relayout(idle_map: TopologyMap) -> None:
    raw = _raw("idle")
    extra = synthetic_raw_state([("v4:2x2x2", 1)])["nodes"][1:]
    raw["nodes"] = raw["nodes"] + extra
    sent = _capture(idle_map)
    rev = idle_map.geometry["rev"]
    idle_map.update(build_snapshot(raw))
    assert idle_map.geometry["rev"] == rev + 1
    names = [g["name"] for g in idle_map.geometry["slices"]]
    assert names == ["tpu-v4-2x2x2-0", S0, S1]  # sorted by name: indices shift, so re-layout
    v4 = idle_map.geometry["slices"][0]
    assert v4["ndims"] == 3 and v4["grid"] == [1, 1, 2]
    assert [m["type"] for m in sent] == ["full"]
    assert sent[0]["geometry_rev"] == rev + 1 and len(sent[0]["hosts"]) == 3


def test_view_asks_for_full_state_and_details(idle_map: TopologyMap) -> None:
    sent = _capture(idle_map)
    idle_map._on_view_msg(idle_map, {"type": "request_full"}, [])
    idle_map._on_view_msg(idle_map, {"type": "details", "slice": S0, "worker": 2}, [])
    idle_map._on_view_msg(idle_map, {"type": "details", "slice": "nope", "worker": 9}, [])
    idle_map._on_view_msg(idle_map, "junk", [])
    assert [m["type"] for m in sent] == ["full", "details", "details"]
    details = sent[1]
    assert details["labels"]["ray.io/tpu-worker-id"] == "2" and details["node_id"]
    assert "labels" not in sent[2]


def test_highlight_status_selected(idle_map: TopologyMap) -> None:
    assert idle_map.selected == {}
    assert idle_map.highlight == [] and idle_map.status == ""
    idle_map.set_highlight([S1, S0, S1])
    assert idle_map.highlight == [S0, S1]
    idle_map.set_status("disconnected — retrying")
    assert idle_map.status == "disconnected — retrying"
    m = TopologyMap(_snap("idle"), highlight=[S1])
    try:
        assert m.highlight == [S1]
        assert "#a142f4" in inline_svg_imgs(m._repr_mimebundle_()[0]["text/html"])  # ring in the static SVG
    finally:
        m.close()


def test_mimebundle_carries_static_fallbacks() -> None:
    m = TopologyMap(_snap("one_reserved"))
    try:
        data, _meta = m._repr_mimebundle_()
        assert data["application/vnd.jupyter.widget-view+json"]["model_id"] == m.model_id
        assert S0 in data["text/plain"] and S1 in data["text/plain"]
        assert "reserved" in data["text/plain"]
        assert '<img class="raytpu-svg"' in data["text/html"]  # survives untrusted sanitizing
        assert "<svg" not in data["text/html"]
        html = inline_svg_imgs(data["text/html"])
        assert "<svg" in html and 'class="host"' in html
        assert html.count('class="chip"') == 32
    finally:
        m.close()


def test_js_module_is_an_es_module_with_render() -> None:
    js = Path(topology_map.__file__).with_name("topology_map.js")
    assert js.is_file()
    text = js.read_text()
    assert re.search(r"^export default \{ render \};$", text, re.M)
    assert re.search(r"^function render\(\{ model, el \}\)", text, re.M)
    assert "return () =>" in text  # cleanup
    assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", text)  # no network
    m = TopologyMap()
    try:
        assert m._esm == text  # the synced module is the package file
    finally:
        m.close()


def test_closing_maps_leaves_no_open_widgets() -> None:
    gc.collect()
    before = len(ipywidgets.widgets.widget._instances)
    maps = [TopologyMap(_snap("idle")) for _ in range(5)]
    assert len(ipywidgets.widgets.widget._instances) >= before + 5
    for m in maps:
        m.close()
    assert len(ipywidgets.widgets.widget._instances) == before
    assert all(m.closed for m in maps)
    maps[0].update(_snap("one_reserved"))  # a late refresh of a closed map is a no-op
    assert maps[0].snapshot is not None and maps[0].snapshot.slices[0].state == "free"


def test_pod_scale_delta_is_small() -> None:
    raw = synthetic_raw_state([("v6e:16x16", 8)])  # 512 hosts
    m = TopologyMap(build_snapshot(raw))
    try:
        sent = _capture(m)
        m.update(build_snapshot(mark_busy(raw, 0.01, seed=7)))
        (delta,) = sent
        assert len(delta["h"]) == 5 and 1 <= len(delta["s"]) <= 5
        assert all(s[2] == "partial" for s in delta["s"])
        assert len(json.dumps(delta)) < 2_000
    finally:
        m.close()


def test_mixed_cluster_renders_every_generation_and_unknown_shapes_and_sets_odd_nodes_aside(
) -> None:
    import copy
    import json
    import xml.etree.ElementTree as ET
    from pathlib import Path

    from raytpu_lab.state import build_snapshot
    from raytpu_lab.widgets.svg import render_svg

    raw = json.loads((Path(__file__).parent / "fixtures" / "raw_v6e_4x4_x2_idle.json").read_text())
    tpu = next(n for n in raw["nodes"] if n["labels"].get("ray.io/tpu-worker-id") == "0")
    v4 = copy.deepcopy(tpu)
    v4.update(node_id="v4" * 28, labels={
        "ray.io/tpu-slice-name": "tpu-v4-2x2x1-0", "ray.io/tpu-worker-id": "0",
        "ray.io/tpu-topology": "2x2x1", "ray.io/tpu-pod-type": "v4-8",
        "ray.io/accelerator-type": "TPU-V4"},
        resources_total={"TPU": 4.0, "TPU-v4-8-head": 1.0}, resources_available={"TPU": 4.0})
    gpu = {"node_id": "g" * 56, "alive": True, "ip": "10.0.0.9", "is_head": False,
           "labels": {"ray.io/accelerator-type": "A100"}, "resources_total": {"GPU": 8.0},
           "resources_available": {"GPU": 8.0}}
    unknown = copy.deepcopy(tpu)
    unknown.update(node_id="u" * 56, labels={**tpu["labels"], "ray.io/tpu-pod-type": "v9-16",
                                             "ray.io/tpu-slice-name": "odd-0"})
    raw["nodes"] += [v4, gpu, unknown]
    snap = build_snapshot(raw)
    assert {s.pod_type for s in snap.slices} == {"v6e-16", "v4-8", "v9-16"}
    assert not snap.slice("odd-0").shape_known  # Ray labels it a TPU host: drawn, not set aside
    assert {n.node_id for n in snap.other_nodes if not n.is_head} == {"g" * 56}
    live = TopologyMap(snap)
    names = [s["name"] for s in live.geometry["slices"]]
    assert names == sorted(["odd-0", "tpu-v4-2x2x1-0", "tpu-v6e-4x4-0", "tpu-v6e-4x4-1"])
    ET.fromstring(render_svg(snap))
    live.close()


def test_dcn_groups_reach_the_view_and_the_static_map(idle_map: TopologyMap) -> None:
    assert idle_map.dcn == []
    idle_map.set_dcn([iter([S0, S1]), [S1]])  # a single slice is no multi-slice group
    assert idle_map.dcn == [[S0, S1]]
    html = inline_svg_imgs(idle_map._repr_mimebundle_()[0]["text/html"])
    assert f'class="dcn-link" data-from="{S0}" data-to="{S1}"' in html
    idle_map.set_dcn([])
    assert "dcn-link" not in inline_svg_imgs(idle_map._repr_mimebundle_()[0]["text/html"])


def test_unknown_shape_slice_gets_a_schematic_geometry_and_its_hosts() -> None:
    # A v2-8 TPU VM (one host, 2x2: no such entry in Ray's table) next to a known slice.
    raw = _raw("idle")
    tpu = next(n for n in raw["nodes"] if n["labels"].get("ray.io/tpu-worker-id") == "0")
    v2 = {**tpu, "node_id": "2" * 56, "labels": {
        "ray.io/tpu-slice-name": "tpu-v2-8", "ray.io/tpu-worker-id": "0",
        "ray.io/tpu-topology": "2x2", "ray.io/tpu-pod-type": "v2-8",
        "ray.io/accelerator-type": "TPU-V2"},
        "resources_total": {"TPU": 4.0, "TPU-v2-8-head": 1.0},
        "resources_available": {"TPU": 4.0, "TPU-v2-8-head": 1.0}}
    raw["nodes"].append(v2)
    m = TopologyMap(build_snapshot(raw))
    try:
        geo = {g["name"]: g for g in m.geometry["slices"]}
        assert geo["tpu-v2-8"] == {"name": "tpu-v2-8", "pod_type": "v2-8", "topology": "2x2",
                                   "ndims": 2, "dims": [2, 2], "grid": [1, 1], "block": [2, 2],
                                   "wrap": [False, False], "hosts": 1, "known": False}
        assert geo[S0]["known"] is True
        full = json.loads(json.dumps(m._full_message()))  # as the view receives it
        si = [g["name"] for g in m.geometry["slices"]].index("tpu-v2-8")
        title, state, reasons = full["slices"][si]
        assert (state, full["hosts"][si]) == ("degraded", [[0, 4, 0, 0, None, "", []]])
        assert reasons.startswith("unknown TPU shape v2-8 (2x2)") and full["other"] == 1
        assert "tpu-v2-8" in inline_svg_imgs(m._repr_mimebundle_()[0]["text/html"])
    finally:
        m.close()
