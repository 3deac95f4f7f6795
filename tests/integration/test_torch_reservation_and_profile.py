"""``%%raytpu torch --reservation NAME`` and ``--profile START:STOP``: the same run path as JAX.

On the session cluster's one emulated v5p 2x2x2 slice (2 hosts x 4 chips), with two workers of
4 chips each (a torch process per worker on a 2-core machine). The reservation lends its slice to
the run and holds it again afterwards; the profile window is traced by torch_xla's profiler on
every worker into the run's storage, and analysed into ``lab.last_profile``.
"""

from __future__ import annotations

import json
from pathlib import Path

import IPython
import pytest
from IPython.testing.globalipapp import start_ipython
from IPython.utils.capture import capture_output

from raytpu_lab.errors import ReservationError
from raytpu_lab.lab import Lab
from raytpu_lab.train.torch_run import TorchRunResult

from .conftest import live_placement_groups, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CELL = """
def train_loop_per_worker(config):
    import torch, ray.train
    from raytpu_lab.train import torch_xla_utils as txu

    dev = txu.device()
    model = torch.nn.Linear(8, 2).to(dev)
    txu.broadcast_parameters(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.ones(16, 8).to(dev), torch.zeros(16, dtype=torch.long).to(dev)
    for step in range(config["steps"]):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        txu.optimizer_step(opt, model)
        ray.train.report({"step": step, "loss": loss.item()})
"""


@pytest.fixture(scope="module")
def ip():
    shell = start_ipython() or IPython.get_ipython()  # None if another module started it
    shell.run_line_magic("load_ext", "raytpu_lab")
    return shell


def _run(ip, line: str):
    with capture_output() as out:
        result = ip.run_cell(f"%%raytpu {line}\n{CELL}", store_history=False)
    shown = "".join(o.data.get("text/plain", "") + "\n" for o in out.outputs)
    return out.stdout + out.stderr + shown, result.error_in_exec


def test_torch_cell_runs_on_the_reservation_and_it_takes_the_slice_back(ip, lab: Lab) -> None:
    mine = lab.reserve("2x2x2", "v5p", name="tmine")
    try:
        text, error = _run(ip, "torch --reservation tmine --chips-per-worker 4 --name tres "
                               "--config \"{'steps': 2}\"")
        assert error is None, text
        run = ip.user_ns["last_run"]
        assert isinstance(run, TorchRunResult) and run.summary()["trainer"] == "torch"
        assert run.slice_names == mine.slice_names and run.steps == 2
        assert {p["slice"] for p in run.chip_placement.values()} == set(mine.slice_names)
        (slice_name,) = mine.slice_names
        snap = lab.snapshot()
        assert snap.slice(slice_name).owners == ["tmine"] and snap.slice(slice_name).head_locked
        assert sorted(pg["name"] for pg in live_placement_groups()) == \
            ["raytpu:tmine", f"raytpu:tmine:head:{slice_name}"]
        # The Python API refuses a mismatch before anything starts, as for JAX.
        ns: dict = {}
        exec(CELL, ns)
        with pytest.raises(ReservationError, match="not 1 x v4-16"):
            lab.train_torch(ns["train_loop_per_worker"], "2x2x2", "v4", reservation="tmine")
    finally:
        lab.release("tmine")
    assert wait_until(lambda: not live_placement_groups(), 10), live_placement_groups()


def test_torch_profile_window_is_traced_on_every_worker(ip, lab: Lab, tmp_path: Path) -> None:
    text, error = _run(ip, f"torch --topology 2x2x2 --version v5p --chips-per-worker 4 "
                           f"--name tprof --storage {tmp_path} --config \"{{'steps': 4}}\" "
                           "--profile 1:3")
    assert error is None, text
    ranks = sorted((tmp_path / "tprof" / "profile").glob("rank*"))
    assert len(ranks) == 2, ranks
    for rank_dir in ranks:
        meta = json.loads((rank_dir / "steps.json").read_text())
        assert meta["tracer"] == "torch_xla" and meta["error"] is None, meta
        assert meta["traced_steps"] == [1, 2] and meta["reports"] == 4
        assert list(rank_dir.glob("plugins/profile/*/*.xplane.pb")), list(rank_dir.rglob("*"))
    report = lab.last_profile
    assert report is not None and report.window == (1, 3)
    assert sorted({(b.rank, b.step) for b in report.breakdown}) == [(r, s) for r in range(2)
                                                                   for s in (1, 2)]
    assert wait_until(lambda: not live_placement_groups(), 10), live_placement_groups()
