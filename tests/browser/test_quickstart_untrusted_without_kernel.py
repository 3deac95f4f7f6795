"""The executed quickstart (what ``make demo`` saves), opened in JupyterLab untrusted and with no
kernel at all, as a colleague opens a shared notebook: the loss chart (plotly's own renderer) and
the map snapshot show, and no "Error displaying widget". Screenshot ``build/quickstart_untrusted.png``.
"""

from __future__ import annotations

import time
from pathlib import Path

import nbformat
import pytest

from tests.browser.conftest import LabServer, jupyterlab_page
from tests.browser.test_live_map_in_jupyterlab import Notebook, _poll

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

BUILD = Path(__file__).resolve().parents[2] / "build"


def test_executed_quickstart_shows_untrusted_with_no_kernel(lab_server: LabServer,
                                                           quickstart_build: dict) -> None:
    nb = nbformat.read(quickstart_build["out"] / "quickstart.ipynb", as_version=4)
    # A kernel this server does not have: JupyterLab asks which one, and "No Kernel" is chosen.
    nb.metadata["kernelspec"] = {"name": "not-on-this-server", "display_name": "gone",
                                 "language": "python"}
    name = "quickstart-untrusted.ipynb"
    nbformat.write(nb, lab_server.root_dir / name)  # written here, so never signed (untrusted)
    map_cell = next(i for i, c in enumerate(nb.cells) if "%raytpu status" in c.source)
    run_cell = next(i for i, c in enumerate(nb.cells) if c.source.startswith("%%raytpu jax"))
    with jupyterlab_page(lab_server, [], "unused-q.ipynb", BUILD / "quickstart_untrusted_failure.png",
                         height=1300) as (page, page_errors):
        page.goto(lab_server.lab_url(name))
        no_kernel = page.locator(".jp-Dialog .jp-Dialog-button", has_text="No Kernel")
        _poll("JupyterLab asks for a kernel", no_kernel.count, 60, 0.3)
        no_kernel.first.click()
        view = Notebook(page, lab_server)
        view.cell(len(nb.cells) - 1).wait_for(timeout=60_000)
        sessions = lab_server.api("/api/sessions")
        assert not [s for s in sessions if s.get("kernel")], sessions  # type: ignore[union-attr]
        view.cell(run_cell).evaluate("e => e.scrollIntoView({block: 'start'})")
        drawn = view.cell(run_cell).locator(
            ".jp-RenderedPlotly .main-svg, .jp-RenderedPlotly img.plot-img[src^='data:image/png']")
        _poll("the loss chart renders (plotly's mime renderer, untrusted, no kernel)",
              drawn.count, 60, 0.5)
        map_img = view.cell(map_cell).locator("img.raytpu-svg")
        _poll("the status cell shows its map snapshot", map_img.count, 30)
        assert map_img.first.evaluate("e => e.naturalWidth") > 100
        drawn.first.evaluate("e => e.scrollIntoView({block: 'center'})")  # the chart in the shot
        time.sleep(1)
        page.screenshot(path=str(BUILD / "quickstart_untrusted.png"))
        text = view.panel.inner_text()
        assert "Error displaying widget" not in text, text[-2000:]
        assert "Loading widget" not in text, text[-2000:]
        assert not page_errors, page_errors[-5:]
