"""The serve load panel in a real JupyterLab, driven by headless Chromium.

One notebook run cell by cell on its own one-host emulated cluster (a single-host v4 ``2x2x1``
slice; the session's shared cluster has none): reserve the slice, ``%%raytpu serve --on`` a tiny
deployment, ``%raytpu serve load APP --rps 10 --duration 2``; the panel's latency chart draws
lines (non-empty SVG polylines with real extent), its summary shows the numbers, a screenshot
goes to ``build/serve_panel.png``. The saved notebook is small and holds no script; ``serve
delete`` + ``release`` + ``down`` leave no app, actor, placement group or cluster behind.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import nbformat
import pytest

from tests.browser.conftest import LabServer, jupyterlab_page
from tests.browser.test_live_map_in_jupyterlab import Notebook, _poll

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300), pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "build"
NOTEBOOK = "serve_panel.ipynb"
CLUSTER = "rt-bserve"
SERVE_INFO = re.compile(r"\bINFO \d{4}-\d\d-\d\d ")  # Serve's log format

SERVE_CELL = '''%%raytpu serve --on s1 --app echo --route /echo
class Echo:
    def __call__(self, request):
        return "hello"
'''

LEFT_CELL = '''import time

import ray
from ray.util.placement_group import placement_group_table
from ray.util.state import list_actors

def left():  # Serve's own actors and every live placement group of this (private) cluster
    # An explicit address: other emulated clusters (the test session's shared one) may run too.
    here = ray.get_runtime_context().gcs_address
    actors = [a.class_name for a in list_actors(address=here, filters=[("state", "=", "ALIVE")])]
    return {"actors": [a for a in actors if a.startswith(("Serve", "Proxy", "_Host"))],
            "groups": [g["name"] for g in placement_group_table().values()
                       if g["state"] != "REMOVED"],
            "reservations": len(get_lab().reservations())}

for _ in range(60):  # actors end a moment after their app is deleted
    if left() == {"actors": [], "groups": [], "reservations": 0}:
        break
    time.sleep(0.5)
print("LEFT", json.dumps(left()))
'''

CELLS = [
    "%load_ext raytpu_lab\nimport json\nfrom raytpu_lab import get_lab",
    f"%raytpu up --tpu v4:2x2x1 --slices 1 --name {CLUSTER}",
    "%raytpu reserve 2x2x1 --version v4 --name s1",
    SERVE_CELL,
    "%raytpu serve load echo --rps 10 --duration 2",
    "%raytpu serve delete echo\n%raytpu release s1",
    LEFT_CELL,
    "%raytpu down",
]
LOAD, UP, RESERVE, SERVE, LOADTEST, DELETE, LEFT, DOWN = range(len(CELLS))


def _print_outputs(page, server: LabServer, page_errors: list[str]) -> None:
    nb = Notebook(page, server)
    for i in range(len(CELLS)):
        try:
            print(f"--- cell {i}:\n{nb.output_text(i)[-1500:]}")
        except Exception as e:  # noqa: BLE001 (diagnostics only)
            print(f"--- cell {i}: ({e})")
    print("page errors:", page_errors[-5:])


def test_serve_panel_in_jupyterlab(lab_server: LabServer) -> None:
    with jupyterlab_page(lab_server, CELLS, NOTEBOOK, BUILD / "serve_panel_failure.png",
                         height=900, on_failure=lambda p, e: _print_outputs(p, lab_server, e)
                         ) as (page, page_errors):
        _drive(page, lab_server, page_errors)


def _drive(page, server: LabServer, page_errors: list[str]) -> None:
    t0 = time.monotonic()
    page.goto(server.lab_url(NOTEBOOK))
    nb = Notebook(page, server)
    nb.cell(len(CELLS) - 1).wait_for(timeout=60_000)
    nb.wait_kernel_idle(timeout_s=60)
    nb.run(LOAD, timeout_s=60)
    nb.run(UP, timeout_s=150)
    out = nb.run(RESERVE, timeout_s=60)
    assert "s1" in out, out
    out = nb.run(SERVE, timeout_s=120)
    assert re.search(r"Serving 'echo' at http://127\.0\.0\.1:\d+/echo", out), out
    # Serve's routine INFO lines (driver and its actors) are not printed in the cell.
    assert not SERVE_INFO.search(out), out

    out = nb.run(LOADTEST, timeout_s=60)
    panel = nb.cell(LOADTEST).locator(".raytpu-serve-panel")
    _poll("the cell shows the load panel", panel.count, 10)
    summary = panel.locator(".raytpu-serve-summary").inner_text()
    m = re.search(r"\(finished\): (\d+) sent, (\d+) ok, (\d+) errors, ([\d.]+) req/s", summary)
    assert m, summary
    sent, ok, errors, rps = int(m[1]), int(m[2]), int(m[3]), float(m[4])
    assert 15 <= sent <= 25 and ok == sent and errors == 0 and rps > 5, summary
    assert re.search(r"p50 [\d.]+ ms, p90 [\d.]+ ms, p99 [\d.]+ ms", summary), summary
    assert panel.locator(".raytpu-serve-summary").is_visible()
    # The latency chart: one polyline per percentile, each with several points spanning the axis.
    latency = panel.locator("svg.raytpu-serve-chart").nth(1)
    assert "latency" in (latency.text_content() or "")
    lines = latency.locator("polyline.series").evaluate_all(
        "es => es.map(e => { const b = e.getBBox(); return [e.dataset.key, "
        "e.getAttribute('points').trim().split(/\\s+/).length, b.width, b.height] })")
    assert [k for k, *_ in lines] == ["p50", "p90", "p99"], lines
    for key, points, width, height in lines:
        assert points >= 2 and width > 50, (key, points, width, height)
    box = latency.bounding_box()
    assert box is not None and box["width"] >= 300 and box["height"] >= 100, box
    state = panel.locator(".raytpu-serve-state").inner_text()
    assert "RUNNING" in state and re.search(r"1/1", state), state
    nb.cell(LOADTEST).evaluate("e => e.scrollIntoView({block: 'center'})")
    page.screenshot(path=str(BUILD / "serve_panel.png"))

    out = nb.run(DELETE, timeout_s=60)
    assert "Deleted app 'echo'" in out, out
    assert not SERVE_INFO.search(out), out
    assert not SERVE_INFO.search(nb.output_text(LOADTEST)), nb.output_text(LOADTEST)
    left = nb.run(LEFT, timeout_s=60)
    m = re.search(r"LEFT (\{.*\})", left)
    assert m, left
    assert json.loads(m[1]) == {"actors": [], "groups": [], "reservations": 0}, left
    _save(page, server)
    nb.run(DOWN, timeout_s=120)
    from raytpu_lab.cluster import emulator
    _poll("the notebook's cluster is down", lambda: emulator.find(CLUSTER) is None, 30, 0.5)
    assert not page_errors, page_errors[-5:]
    print(f"serve panel test drove the notebook in {time.monotonic() - t0:.0f} s; "
          f"load: {sent} sent, {errors} errors, {rps:.1f} req/s")


def _save(page, server: LabServer) -> None:
    """Ctrl+S; the file on disk holds the finished panel: small, HTML with SVG, no script."""
    page.keyboard.press("Control+s")

    def saved_panel() -> str:
        try:
            nb = nbformat.read(server.root_dir / NOTEBOOK, as_version=4)
        except Exception:  # noqa: BLE001 (being written)
            return ""
        return "".join(str(o.get("data", {}).get("text/html", ""))
                       for o in nb.cells[LOADTEST].get("outputs", []))

    html = _poll("the notebook is saved with the panel", saved_panel, 20, 0.3,
                 ok=lambda h: "(finished)" in h)
    raw = (server.root_dir / NOTEBOOK).read_text()
    assert "<script" not in raw and "plotly.min.js" not in raw
    assert "<polyline" in html and "raytpu-serve-chart" in html
    panel_bytes = len(json.dumps(nbformat.reads(raw, as_version=4).cells[LOADTEST].outputs))
    assert panel_bytes < 30_000, panel_bytes
    print(f"saved notebook {len(raw)} bytes; the panel's outputs {panel_bytes} bytes")
