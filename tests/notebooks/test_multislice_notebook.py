"""notebooks/05_multislice.ipynb runs headless on the shared emulated cluster (two v6e 4x4 slices
of it), through ``python -m tools.demo --notebook`` like the quickstart."""

from __future__ import annotations

import pytest
from pathlib import Path

import nbformat

from raytpu_lab.widgets.svg import inline_svg_imgs

from ..conftest import REPO, run_notebook

pytestmark = pytest.mark.slow


def test_multislice_notebook_trains_over_dcn_and_ici(tmp_path: Path, shared_cluster) -> None:
    result = run_notebook(REPO / "notebooks" / "05_multislice.ipynb", tmp_path,
                          shared_cluster)["result"]
    assert result["slices"] == 2 and result["hosts"] == 8 and result["devices"] == 32
    assert result["mesh"] == "2x16"
    assert result["slice_ids"] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert result["loss_last"] < result["loss_first"]
    nb = nbformat.read(tmp_path / "05_multislice.ipynb", as_version=4)
    html = [inline_svg_imgs(o["data"]["text/html"]) for c in nb.cells if c.cell_type == "code"
            for o in c.get("outputs", []) if "text/html" in o.get("data", {})]
    assert any('class="dcn-link"' in h for h in html), "no DCN link on the map"
