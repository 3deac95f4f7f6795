"""notebooks/01_quickstart.ipynb runs headless on the emulator and shows its results offline."""

from __future__ import annotations

import json

import nbformat

from raytpu_lab.widgets.run_dashboard import PLOTLY_MIME
from raytpu_lab.widgets.svg import inline_svg_imgs

from ..conftest import REPO


def test_quickstart_trains_on_16_chips_of_one_slice(quickstart_build: dict) -> None:
    result = quickstart_build["result"]
    assert result["hosts"] == 4
    assert result["devices"] == 16
    assert result["slice"].startswith("tpu-v6e-4x4-")
    assert result["loss_last"] < result["loss_first"] * 0.5
    assert result["steps_per_s"] > 0


def test_quickstart_outputs_show_without_a_kernel(quickstart_build: dict) -> None:
    nb = nbformat.read(quickstart_build["out"] / "quickstart.ipynb", as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    html_outputs = [inline_svg_imgs(o["data"]["text/html"]) for o in outputs
                    if "text/html" in o.get("data", {})]
    assert any("<svg" in h and "tpu-v6e-4x4-0" in h for h in html_outputs), "no topology map"
    charts = [o["data"] for o in outputs if PLOTLY_MIME in o.get("data", {})]
    assert charts, "no saved loss chart"
    for chart in charts:  # plotly's own renderer (no kernel, no trust) + an image for the rest
        assert chart["image/svg+xml"].startswith("<svg") and chart["text/plain"]
        assert all(len(t.get("x", [])) <= 2000 for t in chart[PLOTLY_MIME]["data"])
    kinds = {k for o in outputs for k in o.get("data", {})}
    assert "application/vnd.jupyter.widget-view+json" not in kinds  # every live view replaced
    page = (quickstart_build["out"] / "quickstart.html").read_text()
    assert page.count("Plotly.newPlot") == len(charts) and "<svg" in page


def test_quickstart_notebook_is_kilobytes_not_megabytes(quickstart_build: dict) -> None:
    ipynb = quickstart_build["out"] / "quickstart.ipynb"
    page = quickstart_build["out"] / "quickstart.html"
    raw = ipynb.read_text()
    assert "plotly.min.js" not in raw and "Plotly.newPlot" not in raw  # no plotly.js inside
    assert "<script" not in raw
    nb = nbformat.reads(raw, as_version=4)
    run_cell = next(c for c in nb.cells if c.source.startswith("%%raytpu jax"))
    run_bytes = len(json.dumps(run_cell.outputs))
    print(f"quickstart.ipynb {ipynb.stat().st_size} B, html {page.stat().st_size} B, "
          f"the run's outputs {run_bytes} B")
    assert ipynb.stat().st_size < 1_000_000
    assert run_bytes < 200_000  # what one finished run adds
    assert page.stat().st_size < 6_000_000
    assert page.read_text().count("* plotly.js v") == 1  # once per page, not per chart


def test_quickstart_joins_a_running_cluster_and_leaves_it_running(quickstart_build: dict) -> None:
    # run_notebook checked the cluster is the one it found, and nothing is left on it.
    assert "was up before the demo: left running" in quickstart_build["log"]
    nb = nbformat.read(quickstart_build["out"] / "quickstart.ipynb", as_version=4)
    up, down = (next(c for c in nb.cells if c.source.startswith(magic))
                for magic in ("%raytpu up", "%raytpu down"))
    said = "".join(o.get("text", "") for c in (up, down) for o in c.get("outputs", []))
    assert "this session joined it" in said and "keeps running" in said, said


def test_committed_notebook_has_no_outputs() -> None:
    for path in (REPO / "notebooks").glob("*.ipynb"):
        nb = json.loads(path.read_text())
        for cell in nb["cells"]:
            if cell["cell_type"] == "code":
                assert not cell.get("outputs") and not cell.get("execution_count"), path


def test_quickstart_smoke_test_reports_4_devices_per_host_and_16_in_all(quickstart_build: dict) -> None:
    nb = nbformat.read(quickstart_build["out"] / "quickstart.ipynb", as_version=4)
    check = next(c for c in nb.cells if "check" in c.metadata.get("tags", []))
    text = "\n".join(o.get("data", {}).get("text/plain", "") for o in check.outputs)
    assert "4 of 4 hosts ok" in text, text
    rows = [line.split() for line in text.splitlines() if " worker " in line]
    # host (slice worker N), ip, rank, devices, local, psum, ...
    assert [(r[2], r[4], r[5], r[6]) for r in rows] == [(str(w), str(w), "16", "4") for w in range(4)], rows
    # The live map was shown once and, at `down`, replaced by its static copy (no dead widget).
    shown = next(c for c in nb.cells if c.source == "%raytpu map")
    assert any("<svg" in o.get("data", {}).get("text/html", "") or "raytpu-svg" in
               o.get("data", {}).get("text/html", "") for o in shown.outputs)
