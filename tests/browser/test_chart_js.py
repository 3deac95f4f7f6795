"""The live chart's ES module in headless Chromium, fed by a real RunDashboard through a fake model.

No Jupyter, no cluster: a blank page imports ``run_chart.js`` and renders it with the fake model of
``test_map_js`` (its ``send`` reaches :class:`~raytpu_lab.widgets.run_chart.LiveChart`, its
``save_changes`` sets the Python traits), while the dashboard takes report batches as a run's drain
thread would hand them. Checks what a user sees: one line per rank from the first report, the
view thinning itself on ``thin``, the metric dropdown (clear of its label) redrawing the chart.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page

from raytpu_lab.tpu.topology import SliceShape
from raytpu_lab.train.result import RunResult
from raytpu_lab.train.run import RunUpdate
from raytpu_lab.widgets import run_chart
from raytpu_lab.widgets.run_dashboard import RunDashboard
from tests.browser.test_map_js import ORIGIN, PAGE, Bridge, browser  # noqa: F401 (fixture)

pytestmark = [pytest.mark.browser, pytest.mark.clusterless]

SYNCED = ("title", "metrics", "key", "xlabel")
PATHS_JS = "els => els.map(e => [e.dataset.key, e.dataset.rank, e.getAttribute('d') || ''])"


class ChartBridge(Bridge):
    def __init__(self, page: Page, widget: Any) -> None:
        self.page, self.widget = page, widget
        self.out: list[list[Any]] = []
        self._from_page = False
        widget.send = self._capture
        widget.observe(self._trait, names=list(SYNCED))
        page.expose_function("py_send", self._py_send)
        page.expose_function("py_set", self._py_set)


def _open(browser, dash: RunDashboard) -> tuple[Page, ChartBridge]:  # noqa: F811
    page = browser.new_page(viewport={"width": 1200, "height": 700})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.errors = errors  # type: ignore[attr-defined]
    js = Path(run_chart.__file__).with_name("run_chart.js").read_text()
    init = json.dumps({k: getattr(dash.chart, k) for k in SYNCED}).replace("</", "<\\/")
    html = PAGE.replace("./topology_map.js", "./run_chart.js").replace(
        '<div id="app"></div>',
        f'<div id="app"></div><script id="init" type="application/json">{init}</script>')

    def route(r: Any) -> None:
        url = r.request.url
        if url == f"{ORIGIN}/":
            r.fulfill(status=200, content_type="text/html", body=html)
        elif url == f"{ORIGIN}/run_chart.js":
            r.fulfill(status=200, content_type="text/javascript", body=js)
        else:
            r.abort()

    page.route("**/*", route)
    bridge = ChartBridge(page, dash.chart)
    page.goto(f"{ORIGIN}/")
    page.wait_for_function("window.__ready === true")
    return page, bridge


def _report(dash: RunDashboard, step: int, ranks: int = 4, **metrics: float) -> None:
    """One round of reports, folded into the run's result first as the drain thread does."""
    if dash.result is None:
        dash.result_for_tests = RunResult(dash.title, SliceShape.of("v6e", "4x4"), 1)
    result = dash.result or dash.result_for_tests
    dash.on_update(result.absorb(RunUpdate(step * 0.1, records=[
        {"report": step, "rank": r, "time_s": step * 0.1, "step": step,
         **{k: v + r for k, v in metrics.items()}} for r in range(ranks)])))


def _paths(page: Page) -> list[list[str]]:
    return page.locator(".raytpu-chart-live path.trace").evaluate_all(PATHS_JS)


def test_lines_from_the_first_reports_then_thinning_and_metric_switch(browser) -> None:  # noqa: F811
    dash = RunDashboard("js", redraw_interval_s=0.0)
    page, bridge = _open(browser, dash)
    try:
        bridge.flush()
        page.wait_for_selector(".raytpu-chart-live svg")
        _report(dash, 0, loss=1.0, acc=0.1)
        bridge.flush()
        page.wait_for_function("document.querySelectorAll('.raytpu-chart-live path.trace').length >= 4")
        loss = [p for p in _paths(page) if p[0] == "loss"]
        assert sorted(r for _, r, _ in loss) == ["0", "1", "2", "3"]  # every rank, 1st report
        assert all(d.startswith("M") for _, _, d in loss)
        for step in range(1, 400):  # past max_points: the kernel says "thin", the view thins
            _report(dash, step, loss=1.0 / (step + 1), acc=0.1)
            if step % 50 == 0:
                bridge.flush()
        bridge.flush()
        page.wait_for_timeout(700)  # at most two redraws a second
        d = next(d for k, r, d in _paths(page) if k == "loss" and r == "0")
        assert 100 <= d.count("L") <= 200, d.count("L")
        assert page.locator(".raytpu-chart-live select.metric option").all_inner_texts()[:2] == \
            ["loss", "acc"]
        label = page.locator(".raytpu-chart-live .bar label").bounding_box()
        select = page.locator(".raytpu-chart-live select.metric").bounding_box()
        text_w = page.evaluate("""() => { const l = document.querySelector('.raytpu-chart-live .bar label');
            const r = document.createRange(); r.selectNodeContents(l.firstChild);
            return r.getBoundingClientRect().right; }""")
        assert label and select and text_w <= select["x"]  # the dropdown covers no label text
        (Path(__file__).resolve().parents[2] / "build").mkdir(exist_ok=True)
        page.screenshot(path=str(Path(__file__).resolve().parents[2] / "build" / "chart_js.png"))
        page.select_option(".raytpu-chart-live select.metric", "acc")
        bridge.flush()
        page.wait_for_function(
            "document.querySelector('.raytpu-chart-live .panel').dataset.key === 'acc'")
        assert dash._key == "acc"
        acc = [p for p in _paths(page) if p[0] == "acc"]
        assert len(acc) == 4 and all(d.count("L") >= 100 for _, _, d in acc)
        assert not page.errors, page.errors  # type: ignore[attr-defined]
    finally:
        page.evaluate("window.__cleanup()")
        page.close()
        dash.close()
