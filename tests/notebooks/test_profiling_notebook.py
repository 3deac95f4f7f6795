"""notebooks/06_profiling.ipynb runs headless on the shared emulated cluster (its `%raytpu up
--tpu v4:2x2x2 --slices 2` joins it), executed cell by cell to read each cell's output: the
profile's breakdown, straggler, top ops and recompilations, goodput parts that add up to the
wall time (within 5%), and MFU said to be meaningless on CPU devices."""

from __future__ import annotations

import json

import nbformat
from nbclient import NotebookClient

from tools.demo import _VenvKernelManager

from ..conftest import CLEAN, REPO, check_saved_outputs, settled_leftovers


def _text(cell: nbformat.NotebookNode) -> str:
    parts = []
    for o in cell.get("outputs", []):
        parts.append(o.get("text", "") or o.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


def _tagged(cells: list, tag: str) -> nbformat.NotebookNode:
    return next(c for c in cells if tag in c.metadata.get("tags", []))


def test_profiling_notebook_shows_breakdown_straggler_goodput_and_mfu(shared_cluster,
                                                                      tmp_path) -> None:
    nb = nbformat.read(REPO / "notebooks" / "06_profiling.ipynb", as_version=4)
    NotebookClient(nb, timeout=400, kernel_name="python3", kernel_manager_class=_VenvKernelManager,
                   resources={"metadata": {"path": str(REPO / "notebooks")}}).execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    breakdown = _text(_tagged(code, "breakdown"))
    assert "compile_s" in breakdown and "execute_s" in breakdown  # pandas may wrap the columns
    assert "(rank 0)" in breakdown and "(rank 1)" in breakdown  # one row per host
    assert "(rank 1)" in _text(_tagged(code, "straggler"))
    assert "jit_" in _text(_tagged(code, "ops"))
    assert "jit(step)" in _text(_tagged(code, "recompiles"))
    split = json.loads(_text(_tagged(code, "goodput-json")).strip().splitlines()[-1])
    parts, wall = split["parts"], split["wall_s"]
    assert abs(sum(parts.values()) - wall) <= 0.05 * wall, split
    assert parts["steps"] > 0 and parts["first step (compile)"] > 0 and parts["distributed init"] > 0
    assert "goodput " in _text(_tagged(code, "goodput"))
    mfu = _text(_tagged(code, "mfu"))
    assert "FLOP/s per chip; CPU devices (emulated): MFU not meaningful" in mfu, mfu
    assert "'source': 'xla'" in mfu
    assert settled_leftovers(shared_cluster) == CLEAN
    nbformat.write(nb, tmp_path / "06_profiling.ipynb")
    check_saved_outputs(tmp_path)  # small, script-free
