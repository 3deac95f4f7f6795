"""notebooks/08_serving.ipynb runs headless on the shared emulated cluster (its `%raytpu up --tpu
v4:2x2x2 --slices 2` joins it): train on a reserved two-host slice, serve the trained model from
the same reservation (the replica starts JAX on both hosts), load-test it, delete, release. The
saved notebook is small and script-free and nothing is left on the cluster."""

from __future__ import annotations

import json
import re

import nbformat
from nbclient import NotebookClient

from tools.demo import _VenvKernelManager

from ..conftest import CLEAN, REPO, check_saved_outputs, settled_leftovers


def _text(cell: nbformat.NotebookNode) -> str:
    parts = []
    for o in cell.get("outputs", []):
        parts.append(o.get("text", "") or o.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


def test_serving_notebook_trains_serves_loads_and_leaves_nothing(shared_cluster, tmp_path) -> None:
    nb = nbformat.read(REPO / "notebooks" / "08_serving.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", kernel_manager_class=_VenvKernelManager,
                   resources={"metadata": {"path": str(REPO / "notebooks")}}).execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    by_start = {c.source.splitlines()[0]: c for c in code}
    trained = _text(by_start["%%raytpu run --on s1"])
    assert "process 0 of 2" in trained and "process 1 of 2" in trained, trained
    m = re.search(r"trained: w=([\d.-]+), b=([\d.-]+)", _text(by_start["w, b = get_lab().run_on('s1', '(w, b)').values[0]"]))
    assert m and abs(float(m[1]) - 3.0) < 0.05 and abs(float(m[2]) - 2.0) < 0.05, m
    served = _text(next(c for c in code if c.source.startswith("%%raytpu serve --on s1")))
    assert re.search(r"Serving 'linear' at http://127\.0\.0\.1:\d+/linear", served), served
    answer = re.search(r"ANSWER (\{.*\})", _text(next(c for c in code if "ANSWER" in c.source)))
    assert answer, "no answer printed"
    got = json.loads(answer[1])
    assert got["devices"] == [8, 8] and abs(got["y"] - 32.0) < 0.5, got  # both hosts see the slice
    load = _text(next(c for c in code if "LOAD" in c.source))
    m = re.search(r"LOAD (\d+) sent, (\d+) ok, (\d+) errors", load)
    assert m and int(m[1]) >= 40 and m[1] == m[2] and m[3] == "0", load
    assert "HEALTHY" in _text(by_start["%raytpu serve status linear"])
    assert "Deleted app 'linear'" in _text(by_start["%raytpu serve delete linear"])
    assert "Released 's1'" in _text(by_start["%raytpu release s1"])
    assert settled_leftovers(shared_cluster) == CLEAN
    nbformat.write(nb, tmp_path / "08_serving.ipynb")
    check_saved_outputs(tmp_path)
