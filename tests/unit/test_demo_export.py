"""The demo's HTML export: plotly.js once per page however many charts, SVG maps inlined, no
external script; and the saved run bundles stay free of plotly.js (no kernel, no cluster)."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat

from raytpu_lab.state import build_snapshot
from raytpu_lab.tpu.topology import SliceShape
from raytpu_lab.train.result import RunResult
from raytpu_lab.train.run import RunUpdate
from raytpu_lab.widgets.run_dashboard import PLOTLY_MIME, RunDashboard
from raytpu_lab.widgets.svg import render_status_html
from tools.demo import export_html

FIXTURES = Path(__file__).parent / "fixtures"


def _chart_output(name: str) -> nbformat.NotebookNode:
    dash = RunDashboard(name, live=False)
    result = RunResult(name, SliceShape.of("v4", "2x2x2"), 1)  # what the run's stream fills
    for step in range(30):
        dash.on_update(result.absorb(RunUpdate(float(step), records=[
            {"report": step, "rank": r, "time_s": float(step), "step": step, "loss": 1 / (step + 1)}
            for r in range(2)])))
    result.wall_s = 30.0
    dash.on_end(result)
    return nbformat.v4.new_output("display_data", data=dash.static_chart_bundle())


def test_export_puts_plotly_js_in_the_page_once(tmp_path: Path) -> None:
    raw = json.loads((FIXTURES / "raw_v6e_4x4_x2_idle.json").read_text())
    status = render_status_html(build_snapshot(raw))
    cell = nbformat.v4.new_code_cell("x", outputs=[
        _chart_output("a"), _chart_output("b"),
        nbformat.v4.new_output("display_data", data={"text/html": status, "text/plain": "s"})])
    nb = nbformat.v4.new_notebook(cells=[cell])
    saved = nbformat.writes(nb)
    assert "Plotly.newPlot" not in saved and "plotly.js" not in saved
    page_path = tmp_path / "page.html"
    export_html(nb, page_path)
    page = page_path.read_text()
    assert page.count("* plotly.js v") == 1  # one copy for two charts
    assert page.count('Plotly.newPlot("raytpu-plotly-') == 2
    assert page.count("<svg") >= 1 and 'class="raytpu-svg"' not in page  # the map inlined
    assert "<script src=" not in page  # nothing loaded from elsewhere
    assert len(page) < 6_000_000
    assert PLOTLY_MIME in nb.cells[0].outputs[0]["data"]  # exporting left the notebook as it was


def test_plain_nbconvert_html_shows_an_image_per_chart() -> None:
    from nbconvert import HTMLExporter

    cell = nbformat.v4.new_code_cell("x", outputs=[_chart_output("a"), _chart_output("b")])
    page, _ = HTMLExporter().from_notebook_node(nbformat.v4.new_notebook(cells=[cell]))
    shown = page.count('data-mime-type="image/svg+xml"')
    assert shown == 2, shown  # the SVG of each chart (nbconvert has no plotly renderer)
    assert "Plotly.newPlot" not in page
