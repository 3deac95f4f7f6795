"""The map's ES module in headless Chromium, driven by a real TopologyMap through a fake model.

No Jupyter: a blank page imports ``topology_map.js`` and calls ``render({model, el})`` with a small
model object (get/set/on/off/send/save_changes). Its ``send`` goes to the Python widget through a
Playwright binding (``request_full`` and ``details`` are answered by ``TopologyMap`` itself), its
``save_changes`` sets the Python traits, and what the widget sends (messages, trait changes) is
pushed back into the page: the protocol of ``topology_map.py`` end to end, on one machine, offline.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, sync_playwright

from raytpu_lab.state import build_snapshot
from raytpu_lab.state.synthetic import synthetic_raw_state
from raytpu_lab.widgets import topology_map
from raytpu_lab.widgets.topology_map import TopologyMap

pytestmark = [pytest.mark.browser, pytest.mark.clusterless]

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run", "--disable-sync"]
REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "unit" / "fixtures"
ORIGIN = "http://raytpu.test"
S0, S1 = "tpu-v6e-4x4-0", "tpu-v6e-4x4-1"
SYNCED = ("geometry", "highlight", "status", "selected", "dcn")

PAGE = """<!doctype html><html><head><meta charset="utf-8"></head>
<body style="margin:8px;width:1100px"><div id="app"></div><script type="module">
const state = JSON.parse(document.getElementById("init").textContent);
const handlers = {};
const emit = (name, ...args) => (handlers[name] || []).slice().forEach((cb) => cb(...args));
const dirty = new Set();
window.__sent = [];
window.__apply = (items) => {
  for (const [kind, a, b] of items) {
    if (kind === "msg") emit("msg:custom", a, []);
    else { state[a] = b; emit("change:" + a); }
  }
};
const model = {
  get: (k) => state[k],
  set: (k, v) => { state[k] = v; dirty.add(k); emit("change:" + k); },
  on: (name, cb) => { (handlers[name] = handlers[name] || []).push(cb); },
  off: (name, cb) => { handlers[name] = (handlers[name] || []).filter((f) => f !== cb); },
  send: async (msg) => { window.__sent.push(msg); window.__apply(await window.py_send(msg)); },
  save_changes: () => { for (const k of dirty) window.py_set(k, state[k]); dirty.clear(); },
};
const mod = await import("./topology_map.js");
window.__cleanup = mod.default.render({ model, el: document.getElementById("app") });
window.__handlers = handlers;
window.__ready = true;
</script></body></html>"""


class Bridge:
    """Connects one TopologyMap to the page's fake model."""

    def __init__(self, page: Page, widget: TopologyMap) -> None:
        self.page, self.widget = page, widget
        self.out: list[list[Any]] = []
        self._from_page = False
        widget.send = self._capture  # type: ignore[method-assign]
        widget.observe(self._trait, names=list(SYNCED))
        page.expose_function("py_send", self._py_send)
        page.expose_function("py_set", self._py_set)

    def _capture(self, content: Any, buffers: Any = None) -> None:
        self.out.append(["msg", json.loads(json.dumps(content))])

    def _trait(self, change: dict[str, Any]) -> None:
        if not self._from_page:
            self.out.append(["trait", change["name"], change["new"]])

    def _drain(self) -> list[list[Any]]:
        items, self.out = self.out, []
        return items

    def _py_send(self, msg: dict[str, Any]) -> list[list[Any]]:
        self.widget._on_view_msg(self.widget, msg, [])
        return self._drain()

    def _py_set(self, name: str, value: Any) -> None:
        self._from_page = True
        try:
            setattr(self.widget, name, value)
        finally:
            self._from_page = False

    def flush(self) -> None:
        """Deliver what the widget sent since the last flush, as the widget manager would."""
        self.page.evaluate("items => window.__apply(items)", self._drain())


@pytest.fixture(scope="module")
def browser():
    assert os.path.exists(CHROMIUM), "make test installs Debian's chromium (make browser-deps)"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield b
        b.close()


def _open(browser, widget: TopologyMap) -> tuple[Page, Bridge]:
    page = browser.new_page(viewport={"width": 1200, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.errors = errors  # type: ignore[attr-defined]
    js = Path(topology_map.__file__).with_name("topology_map.js").read_text()
    init = json.dumps({k: getattr(widget, k) for k in SYNCED}).replace("</", "<\\/")
    html = PAGE.replace('<div id="app"></div>',
                        f'<div id="app"></div><script id="init" type="application/json">{init}'
                        "</script>")

    def route(r: Any) -> None:
        url = r.request.url
        if url == f"{ORIGIN}/":
            r.fulfill(status=200, content_type="text/html", body=html)
        elif url == f"{ORIGIN}/topology_map.js":
            r.fulfill(status=200, content_type="text/javascript", body=js)
        else:
            r.abort()  # nothing else: no network

    page.route("**/*", route)
    bridge = Bridge(page, widget)
    page.goto(f"{ORIGIN}/")
    page.wait_for_function("window.__ready === true")
    page.wait_for_selector(".raytpu-map .host, .raytpu-map .slice")
    return page, bridge


@pytest.fixture
def two_slices(browser):
    raw = json.loads((FIXTURES / "raw_v6e_4x4_x2_one_reserved.json").read_text())
    widget = TopologyMap(build_snapshot(raw), highlight=[S0])
    page, bridge = _open(browser, widget)
    yield page, bridge, widget
    page.evaluate("window.__cleanup()")
    assert not page.errors, page.errors  # type: ignore[attr-defined]
    page.close()
    widget.close()


def _count(page: Page, selector: str) -> int:
    return page.locator(selector).count()


def test_dom_contract_counts(two_slices) -> None:
    page, _bridge, _widget = two_slices
    assert _count(page, ".raytpu-map") == 1
    assert _count(page, ".raytpu-map .slice") == 2
    assert _count(page, ".host") == 8
    assert _count(page, ".chip") == 32
    assert _count(page, f'.host[data-slice="{S0}"][data-state="reserved"]') == 4
    assert _count(page, f'.host[data-slice="{S1}"][data-state="free"]') == 4
    assert _count(page, '.chip[data-state="reserved"]') == 16
    assert _count(page, f'.slice[data-slice="{S0}"].highlight') == 1
    assert _count(page, ".slice.highlight") == 1
    legend = page.locator(".raytpu-map-bar .legend").all_inner_texts()
    assert [t.strip() for t in legend] == ["free", "reserved", "busy", "dead", "missing", "provisioning"]
    status = page.locator(".raytpu-map-status").inner_text()
    assert "2 slices · 8 hosts · chips free 16/32" in status
    assert page.evaluate("window.__sent.map(m => m.type)") == ["request_full"]
    (REPO / "build").mkdir(exist_ok=True)
    page.screenshot(path=str(REPO / "build" / "topology_map_js.png"))


def test_hover_shows_node_ip_labels_owner(two_slices) -> None:
    page, _bridge, widget = two_slices
    host = page.locator(f'.host[data-slice="{S0}"][data-worker="2"]')
    host.hover()
    tip = page.locator(".raytpu-map-tooltip")
    node_id = widget.snapshot.slice(S0).hosts[2].node_id
    page.wait_for_function("document.querySelector('.raytpu-map-tooltip').textContent"
                           ".includes('ray.io/tpu-worker-id=2')")
    text = tip.inner_text()
    assert f"node {node_id}" in text and "IP 192.0.2.2" in text
    assert "owner a" in text and "state reserved" in text
    assert {"type": "details", "slice": S0, "worker": 2} in page.evaluate("window.__sent")


def test_click_host_and_title_set_selected_in_python(two_slices) -> None:
    page, _bridge, widget = two_slices
    page.locator(f'.host[data-slice="{S1}"][data-worker="3"]').click()
    node_id = widget.snapshot.slice(S1).hosts[3].node_id
    assert widget.selected == {"slice": S1, "worker": 3, "node_id": node_id}
    assert _count(page, f'.host.selected[data-slice="{S1}"][data-worker="3"]') == 1
    page.locator(f'.slice[data-slice="{S0}"] .slice-title').click()
    assert widget.selected == {"slice": S0}
    assert _count(page, ".host.selected") == 0
    page.mouse.click(1150, 880)  # outside the map: nothing changes
    assert widget.selected == {"slice": S0}


def test_python_updates_reach_the_view(two_slices) -> None:
    page, bridge, widget = two_slices
    idle = json.loads((FIXTURES / "raw_v6e_4x4_x2_idle.json").read_text())
    widget.update(build_snapshot(idle))
    widget.set_highlight([S1])
    widget.set_status("disconnected — retrying")
    bridge.flush()
    assert _count(page, '.host[data-state="free"]') == 8
    assert _count(page, '.chip[data-state="free"]') == 32
    assert _count(page, f'.slice[data-slice="{S1}"].highlight') == 1
    assert _count(page, ".slice.highlight") == 1
    assert "disconnected — retrying" in page.locator(".raytpu-map-status").inner_text()
    # A delta the view cannot apply (a missed revision) makes it ask for the full state again.
    page.evaluate("""() => window.__apply([["msg", {type: "delta", geometry_rev: 1, base: 99,
        rev: 100, s: [], h: [], n: [], other: 0, pending: []}]])""")
    page.wait_for_function("window.__sent.filter(m => m.type === 'request_full').length === 2")


def test_ici_links_on_demand(two_slices) -> None:
    page, _bridge, _widget = two_slices
    assert _count(page, ".ici .link") == 0
    page.locator(".raytpu-map-ici").check()
    assert _count(page, ".ici .link") == 2 * 24  # v6e 4x4: a 4x4 mesh, 2 * 4 * 3 links, no wrap
    page.locator(".raytpu-map-ici").uncheck()
    assert _count(page, ".ici .link") == 0


def test_pod_scale_summary_expands_on_click(browser) -> None:
    raw = synthetic_raw_state([("v6e:16x16", 64)])  # 4,096 hosts
    widget = TopologyMap(build_snapshot(raw))
    page, _bridge = _open(browser, widget)
    try:
        assert _count(page, ".slice.summary") == 64
        assert _count(page, ".host") == 0
        page.locator('.slice.summary[data-slice="tpu-v6e-16x16-3"]').click()
        assert widget.selected == {"slice": "tpu-v6e-16x16-3"}
        assert _count(page, ".slice.summary") == 63
        assert _count(page, '.host[data-slice="tpu-v6e-16x16-3"]') == 64
        assert _count(page, ".chip") == 256
        page.screenshot(path=str(REPO / "build" / "topology_map_js_pod.png"))
        page.locator(".collapse").click()
        assert _count(page, ".slice.summary") == 64
        assert not page.errors, page.errors  # type: ignore[attr-defined]
    finally:
        page.close()
        widget.close()


def test_3d_slice_planes_side_by_side(browser) -> None:
    raw = synthetic_raw_state([("v4:4x4x4", 1), ("v5p:2x2x2", 1)])
    widget = TopologyMap(build_snapshot(raw))
    page, _bridge = _open(browser, widget)
    try:
        assert _count(page, ".host") == 16 + 2
        assert _count(page, ".chip") == 64 + 8
        page.locator(".raytpu-map-ici").check()
        # 4x4x4 torus: 3 axes * 64 chips; 2x2x2: 3 * 4 (no wrap on 2-chip axes)
        assert _count(page, '.slice[data-slice="tpu-v4-4x4x4-0"] .ici .link') == 192
        assert _count(page, '.slice[data-slice="tpu-v5p-2x2x2-0"] .ici .link') == 12
        page.screenshot(path=str(REPO / "build" / "topology_map_js_3d.png"))
        assert not page.errors, page.errors  # type: ignore[attr-defined]
    finally:
        page.close()
        widget.close()


def test_multislice_run_shows_a_dcn_link_between_its_slices(two_slices) -> None:
    page, bridge, widget = two_slices
    assert _count(page, ".dcn-link") == 0
    widget.set_highlight([S0, S1])
    widget.set_dcn([[S0, S1]])
    bridge.flush()
    link = page.locator(f'.dcn-link[data-from="{S0}"][data-to="{S1}"]')
    assert link.count() == 1 and link.locator("text").text_content() == "DCN"
    left = page.locator(f'.slice[data-slice="{S0}"] > .frame').bounding_box()
    right = page.locator(f'.slice[data-slice="{S1}"] > .frame').bounding_box()
    badge = link.locator("rect").bounding_box()
    assert left and right and badge
    centre = badge["x"] + badge["width"] / 2
    assert left["x"] + left["width"] - 1 <= centre <= right["x"] + 1  # in the gap between them
    page.screenshot(path=str(REPO / "build" / "topology_map_dcn.png"))
    widget.set_dcn([])
    bridge.flush()
    assert _count(page, ".dcn-link") == 0


def test_held_chips_are_drawn_at_rays_ids_outlined_and_named_on_hover(two_slices) -> None:
    page, bridge, widget = two_slices
    raw = json.loads((FIXTURES / "raw_v6e_4x4_x2_idle.json").read_text())
    node = next(n for n in raw["nodes"] if n["labels"].get("ray.io/tpu-slice-name") == S1
                and n["labels"].get("ray.io/tpu-worker-id") == "1")
    node["resources_available"]["TPU"] = 1.0
    node["chip_holders"] = [
        {"chips": [3], "actor_id": "ab" * 8, "job_id": "01000000", "pid": 11, "class_name": "Holder",
         "actor_name": "a", "placement_group_id": ""},
        {"chips": [0, 2], "actor_id": "", "job_id": "01000000", "pid": 12, "class_name": "",
         "actor_name": "", "placement_group_id": ""}]
    widget.update(build_snapshot(raw))
    bridge.flush()
    chips = page.locator(f'.host[data-slice="{S1}"][data-worker="1"] .chip')
    drawn = chips.evaluate_all("els => els.map(e => [e.dataset.state, e.dataset.holder || '',"
                               " e.getAttribute('stroke') || ''])")
    task, actor = "task (job 01000000, pid 12)", "Holder 'a' (job 01000000, pid 11)"
    assert drawn == [["busy", task, "#202124"], ["free", "", ""], ["busy", task, "#202124"],
                     ["busy", actor, "#202124"]], drawn
    page.locator(f'.host[data-slice="{S1}"][data-worker="1"]').hover()
    page.wait_for_function("document.querySelector('.raytpu-map-tooltip').textContent"
                           ".includes('chip 3: ')")
    tip = page.locator(".raytpu-map-tooltip").inner_text()
    assert f"chips 0,2: {task}" in tip and f"chip 3: {actor}" in tip, tip
    page.screenshot(path=str(REPO / "build" / "topology_map_chip_holders.png"))
