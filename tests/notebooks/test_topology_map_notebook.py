"""notebooks/03_topology_map.ipynb runs headless on a cluster of its own (`%raytpu up --name topo
--tpu v4:2x2x2 --tpu v5e:2x2`: it stops a host, so it must not break the shared cluster),
executed cell by cell to read each cell's output; the saved copy and its HTML export show the
degraded slice without a kernel."""

from __future__ import annotations

import pytest
import base64
import re

import nbformat
from nbclient import NotebookClient

from raytpu_lab.cluster import emulator
from tools.demo import _VenvKernelManager

from ..conftest import REPO, check_saved_outputs

pytestmark = pytest.mark.slow


def _text(cell: nbformat.NotebookNode) -> str:
    parts = []
    for o in cell.get("outputs", []):
        parts.append(o.get("text", "") or o.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


def _tagged(cells: list, tag: str) -> nbformat.NotebookNode:
    return next(c for c in cells if tag in c.metadata.get("tags", []))


def test_topology_notebook_shows_slices_a_smoke_test_and_a_degraded_slice(tmp_path) -> None:
    nb = nbformat.read(REPO / "notebooks" / "03_topology_map.ipynb", as_version=4)
    try:
        NotebookClient(nb, timeout=300, kernel_name="python3",
                       kernel_manager_class=_VenvKernelManager,
                       resources={"metadata": {"path": str(REPO / "notebooks")}}).execute()
    finally:
        leftover = emulator.find("topo")
        if leftover is not None:  # a failed run: stop the notebook's own cluster
            leftover.down()
    code = [c for c in nb.cells if c.cell_type == "code"]
    slices = _text(_tagged(code, "slices"))
    assert "'v4-16', '2x2x2', 2, 8, 'intact'" in slices and "'2x2', 1, 4, 'intact'" in slices, slices
    check = _text(_tagged(code, "check"))  # the smoke test: 8 devices in all, 4 per host
    assert "2 of 2 hosts ok" in check, check
    rows = [line for line in check.splitlines() if "worker" in line]
    assert len(rows) == 2 and all(" 8 " in r and " 4 " in r and r.rstrip().endswith("ok")
                                  for r in rows), rows
    assert re.search(r"tpu-v4-2x2x2-\d degraded \[.*worker 1", _text(_tagged(code, "degraded")))
    diagnosis = _text(_tagged(code, "diagnosis"))
    assert "degraded: " in diagnosis and "worker 1" in diagnosis, diagnosis
    check_all = _text(_tagged(code, "check-all"))
    assert "1 of 1 hosts ok" in check_all and "not checked: degraded" in check_all, check_all
    static = _tagged(code, "static")
    assert "degraded" in _text(static)
    html = next(o["data"]["text/html"] for o in static.outputs if "text/html" in o.get("data", {}))
    images = [base64.b64decode(m).decode() for m in
              re.findall(r'src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"', html)]
    assert any("<path" in s or "<rect" in s for s in images) or "<svg" in html
    assert emulator.find("topo") is None  # down stopped the cluster it started

    nbformat.write(nb, tmp_path / "03_topology_map.ipynb")
    check_saved_outputs(tmp_path)  # small, script-free
    from nbconvert import HTMLExporter

    page, _ = HTMLExporter().from_notebook_node(nb)
    assert "degraded" in page and ("data:image/svg+xml;base64," in page or "<svg" in page)
