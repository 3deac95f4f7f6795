"""The exported quickstart page, opened in headless Chromium with no network, shows the map and chart
(plotly.js inline once in the page)."""

from __future__ import annotations

import os

import pytest
from playwright.sync_api import sync_playwright

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def page(quickstart_build: dict):
    assert os.path.exists(CHROMIUM), "make test installs Debian's chromium (make browser-deps)"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        context = browser.new_context(offline=True)
        pg = context.new_page()
        errors: list[str] = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.goto((quickstart_build["out"] / "quickstart.html").as_uri())
        pg.wait_for_selector(".js-plotly-plot .main-svg", timeout=30_000)
        pg.errors = errors  # type: ignore[attr-defined]
        yield pg
        browser.close()


def _svg_texts(page) -> list[str]:
    return page.locator("svg text").evaluate_all("els => els.map(e => e.textContent)")


def test_topology_map_is_drawn(page) -> None:
    titles = _svg_texts(page)
    assert any(t.startswith("tpu-v6e-4x4-0") for t in titles), titles[:20]
    assert any(t.startswith("tpu-v6e-4x4-1") for t in titles)
    box = page.locator("svg:has(text)").first.bounding_box()
    assert box is not None and box["width"] > 300


def test_reserved_slice_is_highlighted(page) -> None:
    # The reserve cell's map rings the reserved slice and colours its chips as reserved.
    assert any("reserved by first" in t for t in _svg_texts(page)), _svg_texts(page)[:30]


def test_loss_chart_renders_offline_with_points(page) -> None:
    # The run dashboard's static form: the chosen metric, step time and throughput, one trace per
    # rank (4 hosts) in each.
    plot = page.locator(".js-plotly-plot").first
    assert plot.locator(".scatterlayer .trace").count() == 3 * 4
    d = plot.locator(".scatterlayer .trace path.js-line").first.get_attribute("d") or ""
    assert d.count("L") >= 10
    assert not page.errors, page.errors  # type: ignore[attr-defined]


def test_plotly_js_is_in_the_page_once(quickstart_build: dict) -> None:
    text = (quickstart_build["out"] / "quickstart.html").read_text()
    assert text.count("* plotly.js v") == 1
