"""The run dashboard's front end in a real JupyterLab, fed by synthetic runs (no Ray, no cluster).

The kernel feeds a :class:`~raytpu_lab.widgets.run_dashboard.RunDashboard` from a thread, as a
run's drain thread does, and freezes it at the end, as a finished run does; a
:class:`~raytpu_lab.widgets.topology_map.TopologyMap` of a synthetic v4 2x2x2 slice sits above.
Fast and independent of the emulator, so it checks every time what the page shows: a line per
rank within 10 s of the first report (``step`` and ``epoch``-only runs), the finished run
replaced by plotly's chart and tables, the map and a live dashboard back after a reload, the
front-end bytes of a run, and the saved notebook reopened untrusted with a fresh kernel.
(``test_live_chart_in_jupyterlab`` does the same with real runs on an emulated slice.)
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.browser.conftest import LabServer, jupyterlab_page
from tests.browser.test_live_chart_in_jupyterlab import (
    FIRST_DRAW_S,
    RANKS,
    _drawn_ranks,
    _Frames,
    _Nb,
    _reports_seen,
    _traces,
    check_saved_notebook,
    save_and_wait,
)
from tests.browser.test_live_map_in_jupyterlab import _poll

pytestmark = [pytest.mark.browser, pytest.mark.clusterless, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "build"
NOTEBOOK = "dashboard_frontend.ipynb"

SETUP = '''import os, threading, time
from raytpu_lab.state import build_snapshot
from raytpu_lab.state.synthetic import synthetic_raw_state
from raytpu_lab.tpu.topology import SliceShape
from raytpu_lab.train.result import RunResult
from raytpu_lab.train.run import RunUpdate
from raytpu_lab.widgets.run_dashboard import RunDashboard
from raytpu_lab.widgets.topology_map import TopologyMap

def fake_run(name, reports, key, counter="step", ranks=2, period_s=0.2, warmup_s=1.0):
    """A dashboard fed like a run's drain thread feeds it; frozen at the end like a run.

    The reports start once the file go-<name> exists (the test makes it when the page shows the
    live dashboard, as a slow worker start would wait), so a page slow to draw on a busy machine
    still sees the live phase of a run only seconds long.
    """
    d = RunDashboard(name)
    d.show()
    result = RunResult(name, SliceShape.of("v4", "2x2x2"), 1)  # the one accumulator, as in a run
    def feed():
        t0 = time.monotonic()
        while not os.path.exists(f"go-{name}") and time.monotonic() - t0 < 120:
            time.sleep(0.05)
        time.sleep(warmup_s)  # workers start, JAX compiles...
        d.on_update(result.absorb(RunUpdate(0.5, slices=["tpu-v4-2x2x2-0"], workers=[
            {"rank": r, "slice": "tpu-v4-2x2x2-0", "worker_id": r, "host": f"10.0.0.{r + 1}",
             "node_id": "ab" * 28, "chips": [0, 1, 2, 3]} for r in range(ranks)])))
        for i in range(reports):
            time.sleep(period_s)
            now = time.monotonic() - t0
            d.on_update(result.absorb(RunUpdate(now, records=[
                {"report": i, "rank": r, "time_s": now, counter: i, key: 1.0 / (i + 1) + 0.01 * r}
                for r in range(ranks)], logs=[(r, "stdout", f"rank {r} {counter} {i}") for r in range(ranks)])))
        result.wall_s = time.monotonic() - t0
        d.on_end(result)
        d.freeze()
    threading.Thread(target=feed, daemon=True).start()
    return d

m = TopologyMap(build_snapshot(synthetic_raw_state([("v4:2x2x2", 1)])))
m'''
CELLS = [SETUP, 'd1 = fake_run("prof1", 40, "loss")',
         'd2 = fake_run("epochs", 400, "val_loss", counter="epoch")', "print('end')"]
MAP, RUN1, RUN2, END = range(len(CELLS))


def _first_draw(nb: _Nb, lab_server: LabServer, i: int, run: str, panel: str) -> float:
    cell = nb.cell(i)
    _poll("the cell shows the live dashboard", lambda: cell.locator(".raytpu-dashboard").count(),
          60, 0.2)
    (lab_server.root_dir / f"go-{run}").touch()  # the synthetic run's reports may start
    _poll("the first report reaches the page (status line)", lambda: _reports_seen(cell), 60, 0.1)
    first = time.monotonic()
    _poll(f"within {FIRST_DRAW_S:g} s of the first report the {panel} panel draws a line for "
          f"each of the {RANKS} ranks", lambda: _drawn_ranks(cell, panel), FIRST_DRAW_S, 0.1,
          ok=lambda r: len(r) == RANKS)
    return time.monotonic() - first


def test_dashboard_front_end(lab_server: LabServer) -> None:
    for run in ("prof1", "epochs"):  # a rerun waits for its page again
        (lab_server.root_dir / f"go-{run}").unlink(missing_ok=True)
    with jupyterlab_page(lab_server, CELLS, NOTEBOOK, BUILD / "dashboard_frontend_failure.png",
                         height=1300) as (page, page_errors):
        frames = _Frames(page)
        page.goto(lab_server.lab_url(NOTEBOOK))
        nb = _Nb(page, lab_server)
        nb.cell(len(CELLS) - 1).wait_for(timeout=60_000)
        nb.wait_kernel_idle(timeout_s=60)
        nb.run(MAP, timeout_s=120)
        _poll("the live map draws 2 hosts", lambda: nb.cell(MAP).locator(
            ".raytpu-map .host").count(), 30, ok=lambda n: n == 2)

        start = frames.received
        nb.run(RUN1, timeout_s=60)
        took = {"step": _first_draw(nb, lab_server, RUN1, "prof1", "loss")}
        nb.cell(RUN1).evaluate("e => e.scrollIntoView({block: 'start'})")
        page.screenshot(path=str(BUILD / "dashboard_live_synthetic.png"))
        cell = nb.cell(RUN1)
        _poll("the finished run shows plotly's chart", lambda: cell.locator(
            ".js-plotly-plot .main-svg").count(), 60, 0.3)
        run_bytes = frames.received - start
        assert cell.locator(".raytpu-chart-live").count() == 0  # no widget view left
        assert "Placement" in nb.output_text(RUN1) and "10.0.0.2" in nb.output_text(RUN1)
        time.sleep(1)
        page.screenshot(path=str(BUILD / "dashboard_finished.png"))

        nb.run(RUN2, timeout_s=60)
        took["epoch"] = _first_draw(nb, lab_server, RUN2, "epochs", "val_loss")
        save_and_wait(page, lab_server, NOTEBOOK, RUN2)  # a reload shows what was saved
        page.reload()
        nb.cell(len(CELLS) - 1).wait_for(timeout=60_000)
        reloaded = time.monotonic()
        _poll("after a reload the live dashboard is back with every rank", lambda: _drawn_ranks(
            nb.cell(RUN2), "val_loss"), 30, 0.2, ok=lambda r: len(r) == RANKS)
        _poll("after a reload the live map is back",
              lambda: nb.cell(MAP).locator(".raytpu-map .host").count(), 30, 0.2,
              ok=lambda n: n == 2)
        back_s = time.monotonic() - reloaded
        grow = max((t["d"].count("L") for t in _traces(nb.cell(RUN2))), default=0)
        _poll("the reloaded chart keeps growing", lambda: max(
            (t["d"].count("L") for t in _traces(nb.cell(RUN2))), default=0), 20, 0.5,
            ok=lambda n: n > grow)
        nb.cell(RUN2).evaluate("e => e.scrollIntoView({block: 'start'})")
        page.screenshot(path=str(BUILD / "dashboard_after_reload.png"))
        page.keyboard.press("Control+s")
        time.sleep(2)
        print("RESULT " + json.dumps({"first_draw_s": {k: round(v, 2) for k, v in took.items()},
                                      "reload_back_s": round(back_s, 1),
                                      "frontend_bytes_run1": run_bytes}))
        assert run_bytes < 500_000, run_bytes
        assert not [e for e in page_errors if not re.search(r"ResizeObserver", e)], page_errors


def test_saved_notebook_shows_untrusted_with_a_fresh_kernel(lab_server: LabServer) -> None:
    check_saved_notebook(lab_server, NOTEBOOK, MAP, RUN1, BUILD / "untrusted_dashboard.png")
