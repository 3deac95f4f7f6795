"""notebooks/07_kuberay_gke.ipynb runs headless: manifest -> validate -> emulator -> reserve -> train -> down.

The local path runs on its own emulated cluster, built from the notebook's manifest (2 single-host
v6e 2x2 slices), under a private emulator root; the GKE cells are skipped with a note because no
kubeconfig exists here (``KUBECONFIG`` points at a missing file and ``RAYTPU_GKE`` is unset).
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
import pytest

from raytpu_lab.cluster import emulator

from ..conftest import REPO, check_saved_outputs

pytestmark = pytest.mark.slow

NOTEBOOK = REPO / "notebooks" / "07_kuberay_gke.ipynb"


@pytest.fixture(scope="module")
def kuberay_run(tmp_path_factory: pytest.TempPathFactory, shared_cluster):
    # `shared_cluster` only to wait for it: two clusters starting at once on this 2-core machine
    # make both miss Ray's fixed start-up waits. The manifest's own cluster starts after it.
    out = tmp_path_factory.mktemp("kuberay_nb")
    root = Path(tempfile.mkdtemp(prefix="rtk-", dir="/tmp"))  # short: Ray socket paths
    env = {**os.environ, "RAYTPU_EMULATOR_ROOT": str(root),
           "KUBECONFIG": str(out / "no-kubeconfig"), "RAYTPU_GKE": ""}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    proc = subprocess.run([sys.executable, "-m", "tools.demo", "--notebook", str(NOTEBOOK),
                           "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    log = proc.stdout + proc.stderr
    old = os.environ.get("RAYTPU_EMULATOR_ROOT")
    os.environ["RAYTPU_EMULATOR_ROOT"] = str(root)
    try:
        leftovers = emulator.running()
        for cluster in leftovers:
            cluster.down()
    finally:
        if old is None:
            os.environ.pop("RAYTPU_EMULATOR_ROOT")
        else:
            os.environ["RAYTPU_EMULATOR_ROOT"] = old
    shutil.rmtree(root, ignore_errors=True)
    yield {"proc": proc, "log": log, "out": out, "leftovers": leftovers}


def test_local_path_trains_on_an_emulated_slice_from_the_manifest(kuberay_run: dict) -> None:
    proc, log = kuberay_run["proc"], kuberay_run["log"]
    assert proc.returncode == 0, log[-4000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT "), log[-4000:]
    check_saved_outputs(kuberay_run["out"])  # small, script-free, an image per chart
    result = json.loads(last[len("RESULT "):])
    assert result["slice"] in ("tpu-v6e-2x2-0", "tpu-v6e-2x2-1")  # <group>-<replica> from the manifest
    assert result["hosts"] == 1 and result["devices"] == 4
    assert result["loss_last"] < result["loss_first"]
    assert kuberay_run["leftovers"] == []  # %raytpu down stopped it


def test_validation_and_gke_skip_notes_are_shown(kuberay_run: dict) -> None:
    nb = nbformat.read(kuberay_run["out"] / "07_kuberay_gke.ipynb", as_version=4)
    text = "\n".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
                     for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "Additional properties are not allowed ('replica' was unexpected)" in text
    assert "the TPU webhook requires numOfHosts == 1" in text
    assert "Skipping the GKE cells: no kubeconfig" in text
    assert "('tpu-v6e-2x2-0', 'tpu-v6e-2x2', 'v6e-4', 4.0)" in text
