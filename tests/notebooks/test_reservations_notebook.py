"""notebooks/02_reservations.ipynb runs headless on the shared emulated cluster (its `%raytpu up
--tpu v4:2x2x2 --slices 2` joins it), executed cell by cell to read each cell's output."""

from __future__ import annotations

import nbformat
from nbclient import NotebookClient

from tools.demo import _VenvKernelManager

from ..conftest import CLEAN, REPO, check_saved_outputs, settled_leftovers


def _text(cell: nbformat.NotebookNode) -> str:
    parts = []
    for o in cell.get("outputs", []):
        parts.append(o.get("text", "") or o.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


def test_reservations_notebook_reserves_runs_on_every_host_and_releases(shared_cluster,
                                                                     tmp_path) -> None:
    nb = nbformat.read(REPO / "notebooks" / "02_reservations.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", kernel_manager_class=_VenvKernelManager,
                   resources={"metadata": {"path": str(REPO / "notebooks")}}).execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    by_source = {c.source.splitlines()[0]: c for c in code}
    assert "Reserved 'r1': tpu-v4-2x2x2-" in _text(by_source["%raytpu reserve 2x2x2 --version v4 --name r1"])
    assert "r1: v4-16 2x2x2" in _text(by_source["%raytpu reservations --all"])
    first = _text(next(c for c in code if c.source.startswith("%%raytpu run --on r1")))
    assert "process 0 of 2 - 8 devices" in first and "process 1 of 2 - 8 devices" in first
    assert "[0, 1]" in first
    psum = [c for c in code if "psum" in c.source][0]
    assert "[12.0, 12.0]" in _text(psum)
    check = [c for c in code if "check" in c.metadata.get("tags", [])][0]
    assert "[24.0, 24.0]" in _text(check)
    assert "Released 'r1'" in _text(by_source["%raytpu release r1"])
    assert "keeps running" in _text(by_source["%raytpu down"])  # joined, not started, by it
    assert settled_leftovers(shared_cluster) == CLEAN
    nbformat.write(nb, tmp_path / "02_reservations.ipynb")
    check_saved_outputs(tmp_path)  # small, script-free
