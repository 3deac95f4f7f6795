"""Static renderings: well-formed self-contained SVG, hosts/chips per slice, colours, escaping."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from raytpu_lab.state import ClusterSnapshot, build_snapshot
from raytpu_lab.widgets import (
    STATE_COLORS,
    render_status_html,
    render_status_text,
    render_svg,
    slice_title,
)

FIXTURES = Path(__file__).parent / "fixtures"
NS = "{http://www.w3.org/2000/svg}"
S0, S1 = "tpu-v6e-4x4-0", "tpu-v6e-4x4-1"
EVIL = '<script>alert("x")</script>&'


def _snap(name: str) -> ClusterSnapshot:
    return build_snapshot(json.loads((FIXTURES / f"raw_v6e_4x4_x2_{name}.json").read_text()))


def _hosts(name: str, pod: str, topology: str, n: int, *, avail: float = 4.0,
           accel: str = "TPU-V6E") -> list[dict[str, Any]]:
    nodes = []
    for w in range(n):
        total = {"TPU": 4.0, **({f"TPU-{pod}-head": 1.0} if w == 0 else {})}
        nodes.append({
            "node_id": f"{name}-{w}", "alive": True, "ip": "10.1.0.2", "is_head": False,
            "labels": {"ray.io/tpu-slice-name": name, "ray.io/tpu-worker-id": str(w),
                       "ray.io/tpu-topology": topology, "ray.io/tpu-pod-type": pod,
                       "ray.io/accelerator-type": accel},
            "resources_total": total,
            "resources_available": {**total, "TPU": avail} if avail else {},
        })
    return nodes


def _parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{NS}svg"
    return root


def _groups(root: ET.Element, cls: str, slice_name: str | None = None) -> list[ET.Element]:
    return [g for g in root.iter(f"{NS}g") if g.get("class") == cls
            and (slice_name is None or g.get("data-slice") == slice_name)]


def _chips(host: ET.Element) -> list[ET.Element]:
    return [r for r in host.iter(f"{NS}rect") if r.get("class") == "chip"]


@pytest.mark.parametrize("fixture", ["idle", "one_reserved"])
def test_fixture_svg_has_every_host_and_chip(fixture: str) -> None:
    root = _parse(render_svg(_snap(fixture)))
    for name in (S0, S1):
        hosts = _groups(root, "host", name)
        assert sorted(int(h.get("data-worker", "-1")) for h in hosts) == [0, 1, 2, 3]
        assert sum(len(_chips(h)) for h in hosts) == 16
    legend = {r.get("data-state") for r in root.iter(f"{NS}rect") if r.get("class") == "legend"}
    assert legend == set(STATE_COLORS)


def test_colours_follow_state() -> None:
    root = _parse(render_svg(_snap("one_reserved")))
    fills = {name: {c.get("fill") for h in _groups(root, "host", name) for c in _chips(h)}
             for name in (S0, S1)}
    assert fills == {S0: {STATE_COLORS["reserved"]}, S1: {STATE_COLORS["free"]}}


def test_title_and_tooltip() -> None:
    snap = _snap("one_reserved")
    assert slice_title(snap.slice(S0)) == "tpu-v6e-4x4-0 · v6e-16 · 4x4 · 4/4 hosts · reserved by a"
    assert slice_title(snap.slice(S1)) == "tpu-v6e-4x4-1 · v6e-16 · 4x4 · 4/4 hosts · free"
    root = _parse(render_svg(snap))
    texts = {"".join(t.itertext()) for t in root.iter(f"{NS}text")}
    assert slice_title(snap.slice(S0)) in texts
    head = next(h for h in _groups(root, "host", S0) if h.get("data-worker") == "0")
    tip = head.findtext(f"{NS}title") or ""
    node_id = snap.slice(S0).hosts[0].node_id
    assert node_id and node_id in tip
    for part in ("worker 0 (head)", "IP 192.0.2.2", "state reserved", "owner a", "head locked"):
        assert part in tip


def test_dead_missing_and_busy_hosts() -> None:
    nodes = _hosts("s", "v6e-16", "4x4", 3, avail=0)
    nodes[1]["alive"] = False
    snap = build_snapshot({"fetched_at": 0, "nodes": nodes, "placement_groups": []})
    root = _parse(render_svg(snap))
    states = {h.get("data-worker"): h.get("data-state") for h in _groups(root, "host", "s")}
    assert states == {"0": "busy", "1": "dead", "2": "busy", "3": "missing"}
    by_worker = {h.get("data-worker"): h for h in _groups(root, "host", "s")}
    for worker, state in (("1", "dead"), ("3", "missing"), ("0", "busy")):
        assert {c.get("fill") for c in _chips(by_worker[worker])} == {STATE_COLORS[state]}
    reasons = [t.text for t in root.iter(f"{NS}text") if t.text and t.text.startswith("worker")]
    assert reasons == ["worker 1 dead; worker 3 missing"]


def test_highlight_rings_only_the_named_slice() -> None:
    root = _parse(render_svg(_snap("idle"), highlight={S1}))
    rings = {s.get("data-slice"): [r for r in s.iter(f"{NS}rect") if r.get("class") == "highlight"]
             for s in _groups(root, "slice")}
    assert (len(rings[S0]), len(rings[S1])) == (0, 1)
    assert not [r for r in _parse(render_svg(_snap("idle"))).iter(f"{NS}rect")
                if r.get("class") == "highlight"]


def test_labels_are_escaped() -> None:
    nodes = _hosts(EVIL, "v6e-16", "4x4", 4, avail=0)
    group = {"placement_group_id": "ee" * 18, "name": f"raytpu:{EVIL}", "state": "CREATED",
             "bundles": [{"index": 0, "node_id": nodes[0]["node_id"], "resources": {"TPU": 4.0}}]}
    snap = build_snapshot({"fetched_at": 0, "nodes": nodes, "placement_groups": [group]})
    for out in (render_svg(snap), render_status_html(snap, inline_svg=True)):
        assert "<script" not in out
        root = ET.fromstring(out)  # escaping keeps it well-formed
        assert any(EVIL in "".join(t.itertext()) for t in root.iter())
    assert EVIL in render_status_text(snap)


def test_three_d_slice_lays_planes_side_by_side() -> None:
    nodes = _hosts("cube", "v4-32", "2x2x4", 4, accel="TPU-V4")
    root = _parse(render_svg(build_snapshot({"fetched_at": 0, "nodes": nodes})))
    assert len(_groups(root, "host", "cube")) == 4
    assert {t.text for t in root.iter(f"{NS}text")} >= {"z=0", "z=1", "z=2", "z=3"}
    xs = []
    for h in _groups(root, "host", "cube"):
        outline = next(r for r in h.iter(f"{NS}rect") if r.get("class") != "chip")
        xs.append(float(outline.get("x", "nan")))
    assert len(set(xs)) == 4  # one host per plane, planes side by side


def test_big_slice_draws_hosts_only() -> None:
    nodes = _hosts("big", "v5p-1024", "8x8x8", 128, accel="TPU-V5P")
    root = _parse(render_svg(build_snapshot({"fetched_at": 0, "nodes": nodes})))
    hosts = _groups(root, "host", "big")
    assert len(hosts) == 128 and not any(_chips(h) for h in hosts)
    assert int(root.get("width", "0")) <= 1000


def test_many_slices_wrap_into_rows() -> None:
    nodes = [n for i in range(8) for n in _hosts(f"s{i}", "v6e-16", "4x4", 4)]
    root = _parse(render_svg(build_snapshot({"fetched_at": 0, "nodes": nodes})))
    assert len(_groups(root, "slice")) == 8
    assert int(root.get("width", "0")) <= 1000
    rows = {g.get("transform", "").split(",")[1] for g in root.iter(f"{NS}g") if g.get("transform")}
    assert len(rows) >= 3


def test_svg_is_self_contained() -> None:
    svg = render_svg(_snap("one_reserved"))
    for needle in ("href", "url(", "<style", "<script", "@import", "<link", "font-face"):
        assert needle not in svg


def test_empty_snapshot() -> None:
    snap = build_snapshot({"fetched_at": 0, "nodes": [], "placement_groups": []})
    root = _parse(render_svg(snap))
    assert "No TPU slices in this cluster." in {t.text for t in root.iter(f"{NS}text")}
    assert "(no TPU slices)" in render_status_text(snap)
    ET.fromstring(render_status_html(snap))


def test_status_html_table() -> None:
    html = render_status_html(_snap("one_reserved"), highlight={S0}, inline_svg=True)
    root = ET.fromstring(html)
    rows = [["".join(td.itertext()).strip() for td in tr.iter("td")] for tr in root.iter("tr")]
    rows = [r for r in rows if r]
    assert rows[0] == [S0, "v6e-16", "4x4", "4/4", "0/16", "● reserved", "a"]
    assert rows[1] == [S1, "v6e-16", "4x4", "4/4", "16/16", "● free", "-"]
    assert root.find(f".//{NS}svg") is not None
    assert any(r.get("class") == "highlight" for r in root.iter(f"{NS}rect"))


def test_status_text_table() -> None:
    lines = render_status_text(_snap("one_reserved")).splitlines()
    assert lines[0].split()[:3] == ["slice", "pod", "type"]
    assert lines[1].split() == [S0, "v6e-16", "4x4", "4/4", "0/16", "reserved", "a"]
    assert lines[2].split() == [S1, "v6e-16", "4x4", "4/4", "16/16", "free", "-"]
    assert lines[3] == "chips free 16/32; 1 other node(s)"


def test_multislice_group_gets_one_dcn_link_between_its_slices() -> None:
    snap = _snap("idle")
    assert "dcn-link" not in render_svg(snap)
    svg = render_svg(snap, highlight=[S0, S1], dcn=[[S0, S1]])
    root = ET.fromstring(svg)
    links = [g for g in root.iter(f"{NS}g") if g.get("class") == "dcn-link"]
    assert [(g.get("data-from"), g.get("data-to")) for g in links] == [(S0, S1)]
    assert [t.text for t in links[0].iter(f"{NS}text")] == ["DCN"]
    line = next(links[0].iter(f"{NS}line"))
    panels = {g.get("data-slice"): g for g in root.iter(f"{NS}g") if g.get("class") == "slice"}
    assert set(panels) == {S0, S1}
    # The link runs from the right edge of the first panel to the left edge of the second.
    assert float(line.get("x1")) < float(line.get("x2"))
    assert "dcn-link" in render_status_html(snap, [S0, S1], dcn=[[S0, S1]], inline_svg=True)
    assert "dcn-link" not in render_svg(snap, dcn=[[S0, "not-a-slice"]])


# --- slices whose shape is in no table ------------------------------------------------------

@pytest.mark.parametrize(
    ("nodes", "hosts", "chips", "states"),
    [
        # A v2-8 TPU VM: one host of 4 chips, topology 2x2 (not in Ray's table).
        (_hosts("tpu-v2-8", "v2-8", "2x2", 1, accel="TPU-V2"), 1, 4, ["free"]),
        (_hosts("odd", "v9z-16", "2x4", 2, accel="TPU-V9Z"), 2, 8, ["free", "free"]),
        (_hosts("odd", "v9z-16", "2x4", 1, accel="TPU-V9Z", avail=0), 2, 8, ["busy", "missing"]),
        (_hosts("odd", "v9z-512", "16x16", 64, accel="TPU-V9Z"), 64, 256, ["free"] * 64),
        (_hosts("odd", "v9z-1024", "16x32", 128, accel="TPU-V9Z"), 128, 0, ["free"] * 128),
    ],
)
def test_unknown_shape_slice_is_drawn(nodes: list[dict[str, Any]], hosts: int, chips: int,
                                      states: list[str]) -> None:
    snap = build_snapshot({"fetched_at": 0, "nodes": nodes, "placement_groups": []})
    [s] = snap.slices
    assert not s.shape_known
    svg = render_svg(snap)
    assert svg and s.name in svg
    root = _parse(svg)
    drawn = _groups(root, "host", s.name)
    assert [h.get("data-state") for h in drawn] == states
    assert sum(len(_chips(h)) for h in drawn) == chips  # missing too; none above 64 hosts
    texts = [t.text or "" for t in root.iter(f"{NS}text")]
    assert any(t.startswith(f"unknown TPU shape {s.pod_type} ") for t in texts)
    assert "No TPU slices in this cluster." not in texts
    text = render_status_text(snap)
    assert "(no TPU slices)" not in text
    assert [line.split()[:3] for line in text.splitlines()][1] == [s.name, s.pod_type, s.topology]
    assert "unknown TPU shape" in text
    html = ET.fromstring(render_status_html(snap, inline_svg=True))
    rows = [["".join(td.itertext()).strip() for td in tr.iter("td")] for tr in html.iter("tr")]
    assert [r[:3] for r in rows if r] == [[s.name, s.pod_type, s.topology]]


def test_v2_8_beside_known_slices_keeps_its_chips_in_the_totals() -> None:
    nodes = [*_hosts("tpu-v2-8", "v2-8", "2x2", 1, accel="TPU-V2"),
             *_hosts("s", "v6e-16", "4x4", 4)]
    snap = build_snapshot({"fetched_at": 0, "nodes": nodes, "placement_groups": []})
    assert [(s.name, s.shape_known) for s in snap.slices] == [("s", True), ("tpu-v2-8", False)]
    assert render_status_text(snap).splitlines()[-1] == "chips free 20/20; 0 other node(s)"
    assert slice_title(snap.slice("tpu-v2-8")) == "tpu-v2-8 · v2-8 · 2x2 · 1/1 hosts · degraded"
