"""notebooks/05_multislice.ipynb runs headless on its own emulated cluster (two v6e 4x4 slices).

Run through ``python -m raytpu_lab.demo --notebook`` like the quickstart: it executes every cell,
exports the notebook and stops the cluster the notebook started.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat

from ..conftest import REPO


def test_multislice_notebook_trains_over_dcn_and_ici(tmp_path: Path) -> None:
    emulators = Path(tempfile.mkdtemp(prefix="rtm-", dir="/tmp"))  # short: Ray socket paths
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "raytpu_lab.demo", "--notebook",
             str(REPO / "notebooks" / "05_multislice.ipynb"), "--out", str(tmp_path)],
            cwd=REPO, env={**os.environ, "RAYTPU_EMULATOR_ROOT": str(emulators)},
            capture_output=True, text=True, timeout=900)
        log = proc.stdout + proc.stderr
        assert proc.returncode == 0, log[-4000:]
        assert not list(emulators.glob("*/cluster.json")), "the notebook's cluster was left running"
    finally:
        shutil.rmtree(emulators, ignore_errors=True)
    result = json.loads(proc.stdout.strip().splitlines()[-1][len("RESULT "):])
    assert result["slices"] == 2 and result["hosts"] == 8 and result["devices"] == 32
    assert result["mesh"] == "2x16"
    assert result["slice_ids"] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert result["loss_last"] < result["loss_first"]
    nb = nbformat.read(tmp_path / "05_multislice.ipynb", as_version=4)
    html = [o["data"]["text/html"] for c in nb.cells if c.cell_type == "code"
            for o in c.get("outputs", []) if "text/html" in o.get("data", {})]
    assert any('class="dcn-link"' in h for h in html), "no DCN link on the map"
