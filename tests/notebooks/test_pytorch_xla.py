"""notebooks/04_pytorch_xla.ipynb runs headless on an emulated v5p 2x2x2 it starts itself: 8
TorchTrainer workers (one per chip) on PyTorch/XLA, the loss falls, nothing is left behind."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from raytpu_lab.cluster import emulator

from ..conftest import REPO

NOTEBOOK = REPO / "notebooks" / "04_pytorch_xla.ipynb"


@pytest.fixture(scope="module")
def pytorch_xla_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """Execute the notebook as `make demo` does (nbclient, its own emulated cluster, RESULT line)."""
    out = tmp_path_factory.mktemp("pytorch_xla")
    emulators = Path(tempfile.mkdtemp(prefix="rtp-", dir="/tmp"))  # short: Ray socket paths
    env = {**os.environ, "RAYTPU_EMULATOR_ROOT": str(emulators)}
    proc = subprocess.run([sys.executable, "-m", "raytpu_lab.demo", "--notebook", str(NOTEBOOK),
                           "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT "), log[-4000:]
    yield {"out": out, "emulators": emulators, "result": json.loads(last[len("RESULT "):])}
    shutil.rmtree(emulators, ignore_errors=True)


def test_notebook_trains_one_worker_per_chip_and_the_loss_falls(pytorch_xla_run: dict) -> None:
    result = pytorch_xla_run["result"]
    assert result["slice"] == "tpu-v5p-2x2x2-0"
    assert (result["hosts"], result["devices"], result["backend"]) == (2, 8, "gloo")
    assert result["loss_last"] < result["loss_first"] * 0.7, result
    assert result["steps_per_s"] > 0


def test_notebook_leaves_no_cluster_behind(pytorch_xla_run: dict, monkeypatch) -> None:
    monkeypatch.setenv("RAYTPU_EMULATOR_ROOT", str(pytorch_xla_run["emulators"]))
    assert emulator.find(emulator.DEFAULT_NAME) is None
    assert not list(emulator.state_root().glob("*/cluster.json"))
