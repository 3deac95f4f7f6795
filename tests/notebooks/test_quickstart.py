"""notebooks/01_quickstart.ipynb runs headless on the emulator and shows its results offline."""

from __future__ import annotations

import json

import nbformat

from raytpu_lab.cluster import emulator

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
    html_outputs = [o["data"]["text/html"] for c in nb.cells if c.cell_type == "code"
                    for o in c.get("outputs", []) if "text/html" in o.get("data", {})]
    assert any("<svg" in h and "tpu-v6e-4x4-0" in h for h in html_outputs), "no topology map"
    assert any("Plotly.newPlot" in h for h in html_outputs), "no static loss chart"
    page = (quickstart_build["out"] / "quickstart.html").read_text()
    assert "Plotly.newPlot" in page and "<svg" in page


def test_quickstart_leaves_no_cluster_behind(quickstart_build: dict, monkeypatch) -> None:
    monkeypatch.setenv("RAYTPU_EMULATOR_ROOT", str(quickstart_build["emulators"]))
    assert emulator.state_root() == quickstart_build["emulators"]
    assert emulator.find(emulator.DEFAULT_NAME) is None
    assert not list(emulator.state_root().glob("*/cluster.json"))


def test_committed_notebook_has_no_outputs() -> None:
    for path in (REPO / "notebooks").glob("*.ipynb"):
        nb = json.loads(path.read_text())
        for cell in nb["cells"]:
            if cell["cell_type"] == "code":
                assert not cell.get("outputs") and not cell.get("execution_count"), path
