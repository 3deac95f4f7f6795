"""notebooks/02_reservations.ipynb runs headless on its own small emulated cluster (2 v4 slices).

Its own cluster because the notebook's `%raytpu up` starts one, as a user's would (4 hosts,
about a minute here); a private emulator root keeps it apart from any other cluster.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from raytpu_lab.cluster import emulator
from raytpu_lab.demo import _VenvKernelManager

from ..conftest import REPO


def _text(cell: nbformat.NotebookNode) -> str:
    parts = []
    for o in cell.get("outputs", []):
        parts.append(o.get("text", "") or o.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


def test_reservations_notebook_reserves_runs_on_every_host_and_releases(monkeypatch) -> None:
    root = Path(tempfile.mkdtemp(prefix="rtn-", dir="/tmp"))  # short: Ray socket paths <= 107 bytes
    monkeypatch.setenv("RAYTPU_EMULATOR_ROOT", str(root))
    nb = nbformat.read(REPO / "notebooks" / "02_reservations.ipynb", as_version=4)
    try:
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
        assert "stopped" in _text(by_source["%raytpu down"])
    finally:
        for c in emulator.running():
            c.down()
        shutil.rmtree(root, ignore_errors=True)
