"""notebooks/04_pytorch_xla.ipynb runs headless on the shared emulated cluster (its v5p 2x2x2):
8 TorchTrainer workers (one per chip) on PyTorch/XLA, the loss falls, nothing is left behind
(checked by ``run_notebook``)."""

from __future__ import annotations

import pytest

from ..conftest import REPO, run_notebook

pytestmark = pytest.mark.slow

NOTEBOOK = REPO / "notebooks" / "04_pytorch_xla.ipynb"


def test_notebook_trains_one_worker_per_chip_and_the_loss_falls(tmp_path, shared_cluster) -> None:
    result = run_notebook(NOTEBOOK, tmp_path, shared_cluster)["result"]
    assert result["slice"] == "tpu-v5p-2x2x2-0"
    assert (result["hosts"], result["devices"], result["backend"]) == (2, 8, "gloo")
    assert result["loss_last"] < result["loss_first"] * 0.7, result
    assert result["steps_per_s"] > 0
