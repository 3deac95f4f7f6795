"""The live run dashboard in a real JupyterLab, driven by headless Chromium.

One notebook run cell by cell: ``%raytpu up --tpu v6e:4x4 --slices 1`` (joins the test session's
shared cluster), run a ``%%raytpu jax``
cell that would train for minutes, watch its chart update and its placement table fill (4 ranks),
save a screenshot to ``build/dashboard.png``, click Stop: the cell ends within 15 s saying the run
was stopped, ``last_run.stopped`` is True in the next cell, and the slice is idle again.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.browser.conftest import LabServer, jupyterlab_page
from tests.browser.test_live_map_in_jupyterlab import Notebook, _poll
from tests.conftest import CLEAN, settled_leftovers

pytestmark = [pytest.mark.browser, pytest.mark.timeout(420), pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "build"
NOTEBOOK = "dashboard.ipynb"

TRAIN_CELL = '''%%raytpu jax --topology 4x4 --version v6e --name browser-run --config "{'steps': 100000}"
def train_loop_per_worker(config):
    import time
    import ray.train
    rank = ray.train.get_context().get_world_rank()
    for step in range(config["steps"]):
        time.sleep(0.1)
        print(f"rank {rank} step {step}")
        ray.train.report({"step": step, "loss": 1.0 / (step + 1), "step_time_s": 0.1})
'''

CELLS = [
    "%load_ext raytpu_lab",
    "%raytpu up --tpu v6e:4x4 --slices 1",
    TRAIN_CELL,
    "from raytpu_lab import get_lab\n"
    "print('stopped', last_run.stopped, 'steps', last_run.steps)\n"
    "print('idle', [s.name for s in get_lab().snapshot().idle_slices('v6e-16')])",
    "%raytpu down",
]
LOAD, UP, TRAIN, AFTER, DOWN = range(len(CELLS))


def test_dashboard_updates_and_stops_in_jupyterlab(lab_server: LabServer, shared_cluster) -> None:
    with jupyterlab_page(lab_server, CELLS, NOTEBOOK, BUILD / "dashboard_failure.png",
                         height=1100) as (page, page_errors):
        _drive(page, lab_server, page_errors, shared_cluster)


def _drive(page, server: LabServer, page_errors: list[str], cluster) -> None:
    page.goto(server.lab_url(NOTEBOOK))
    nb = Notebook(page, server)
    nb.cell(len(CELLS) - 1).wait_for(timeout=60_000)
    nb.wait_kernel_idle(timeout_s=60)
    nb.run(LOAD, timeout_s=60)
    nb.run(UP, timeout_s=150)

    before = nb.start(TRAIN)
    dash = nb.cell(TRAIN).locator(".raytpu-dashboard").first
    _poll("the cell shows the dashboard", dash.count, 60)
    line = dash.locator(".raytpu-chart-live path.trace").first  # the SVG live chart

    def line_d() -> str:
        return line.get_attribute("d") or "" if line.count() else ""

    first = _poll("the chart draws a line", line_d, 180, 0.5, ok=lambda d: d.count("L") >= 3)
    _poll("the chart keeps updating", line_d, 10, 0.3, ok=lambda d: d != first)
    table_rows = _poll("the placement table lists 4 ranks",
                       lambda: dash.locator("table tr").count(), 20, ok=lambda n: n >= 5)
    assert table_rows >= 5
    ran_on = re.search(r"tpu-v6e-4x4-[01]", dash.inner_text())
    assert ran_on, dash.inner_text()
    dash.locator(".jupyter-widget-Collapse-header, .lm-AccordionPanel-title, .p-Collapse-header"
                 ).first.click()  # open rank 0's log pane
    _poll("rank 0's log pane shows its lines", lambda: dash.inner_text(), 10,
          ok=lambda t: "rank 0 step" in t)
    nb.cell(TRAIN).evaluate("e => e.scrollIntoView({block: 'start'})")
    page.screenshot(path=str(BUILD / "dashboard.png"))

    stop = dash.locator("button:has-text('Stop')")
    clicked = time.monotonic()
    stop.click()
    nb.wait_done(TRAIN, before, 15)
    took_s = time.monotonic() - clicked
    out = nb.output_text(TRAIN)
    assert "was stopped" in out, out[-2000:]
    print(f"Stop -> cell done in {took_s:.1f} s")

    after = nb.run(AFTER, timeout_s=60)
    assert "stopped True" in after, after
    assert "idle ['tpu-v6e-4x4-0', 'tpu-v6e-4x4-1']" in after, after  # its slice is free again
    nb.run(DOWN, timeout_s=120)
    assert (left := settled_leftovers(cluster)) == CLEAN, left
    assert not page_errors, page_errors[-5:]
