"""PyTorch/XLA runs from a cell on the session cluster's emulated v5p 2x2x2 (2 hosts x 4 chips):
real Ray Train TorchTrainer, 8 torch_xla workers (PJRT on CPU, gloo). Kept to few steps: every
worker is a torch process on a 2-core machine."""

from __future__ import annotations

import os
import signal
import threading
import time

import IPython
import pytest
from IPython.testing.globalipapp import start_ipython
from IPython.utils.capture import capture_output

from raytpu_lab.lab import Lab
from raytpu_lab.train import torch_checks
from raytpu_lab.train.torch_run import TorchRunResult

from .conftest import live_actors, live_placement_groups, wait_until

pytestmark = pytest.mark.integration

TRAIN_CELL = """
def train_loop_per_worker(config):
    import time
    import torch, ray.train
    from sklearn.datasets import load_digits
    from raytpu_lab.train import torch_xla_utils as txu

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    x_all, y_all = load_digits(return_X_y=True)
    dev = txu.device()
    x = torch.tensor(x_all[rank::world] / 16.0, dtype=torch.float32).to(dev)  # this rank's shard
    y = torch.tensor(y_all[rank::world]).to(dev)
    torch.manual_seed(rank)                        # different initial weights on every rank...
    model = torch.nn.Linear(64, 10).to(dev)
    txu.broadcast_parameters(model)                # ...until rank 0's are broadcast
    opt = torch.optim.SGD(model.parameters(), lr=config.get("lr", 0.5))
    for step in range(config["steps"]):
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        txu.optimizer_step(opt, model)
        metrics = {"step": step, "loss": loss.item(), "step_time_s": time.perf_counter() - t0}
        if step == config["steps"] - 1:
            metrics["digest"] = txu.parameter_digest(model)
        ray.train.report(metrics)
"""


@pytest.fixture(scope="module")
def ip():
    shell = start_ipython() or IPython.get_ipython()  # None if another module started it
    shell.run_line_magic("load_ext", "raytpu_lab")
    return shell


def _run(ip, line: str, cell: str):
    with capture_output() as out:
        result = ip.run_cell(f"%%raytpu {line}\n{cell}", store_history=False)
    shown = "".join(o.data.get("text/plain", "") + "\n" for o in out.outputs)
    return out.stdout + out.stderr + shown, result.error_in_exec


def _v5p_idle(lab: Lab) -> bool:
    return all(s.idle for s in lab.snapshot().slices_of("v5p-16"))


@pytest.mark.slow
def test_torch_cell_runs_one_worker_per_chip_in_sync(ip, lab: Lab) -> None:
    actors_before = live_actors()
    text, error = _run(ip, "torch --topology 2x2x2 --version v5p --name t8 --config \"{'steps': 6}\"",
                       TRAIN_CELL)
    assert error is None, text
    run = ip.user_ns["last_run"]
    assert isinstance(run, TorchRunResult)
    assert "8 workers, gloo, PJRT CPU" in text, text
    # One worker per chip: 8 ranks on 8 distinct (host, chip) of the one v5p slice, 2 hosts.
    where = run.chip_placement
    assert sorted(where) == list(range(8))
    assert len({(p["host"], p["chip"]) for p in where.values()}) == 8
    assert {p["host"] for p in where.values()} == {0, 1}
    assert {p["chip"] for p in where.values()} == {0, 1, 2, 3}
    assert len({p["node_id"] for p in where.values()}) == 2
    assert {p["slice"] for p in where.values()} == set(run.slice_names) == {"tpu-v5p-2x2x2-0"}
    # Gradient sync: every rank ends with the same parameters (and started from different ones).
    digests = {r["rank"]: r["digest"] for r in run.records if "digest" in r}
    assert sorted(digests) == list(range(8)) and len(set(digests.values())) == 1
    loss = run.metric("loss")
    assert run.steps == 6 and all(b < a for a, b in zip(loss, loss[1:], strict=False)), loss  # full-batch GD
    # Profile: torch_xla metrics from every rank, compiles settled after warm-up.
    metrics = run.xla_metrics
    assert sorted(metrics) == list(range(8))
    assert all(m["xla_compile_count"] > 0 and m["xla_execute_count"] > 0
               and m["xla_transfer_to_device_count"] > 0 for m in metrics.values())
    assert not any(t.storm for t in run.compile_trends().values())
    assert "torch_xla metrics of 8 ranks; no recompilation storm." in text, text  # the panel
    # Goodput of a PyTorch run: measured, the parts make the wall time (within 5%).
    goodput = run.goodput()
    assert goodput.measured and len(run.timings) == 8
    assert abs(sum(goodput.parts.values()) - run.wall_s) <= 0.05 * run.wall_s
    assert goodput.parts["distributed init"] > 0 and goodput.parts["steps"] > 0, goodput.text()
    assert run.summary()["goodput"]["parts"]["steps"] > 0
    # Nothing held afterwards.
    assert wait_until(lambda: not live_placement_groups(), 10), live_placement_groups()
    assert wait_until(lambda: live_actors() == actors_before, 10), live_actors()
    assert _v5p_idle(lab)


@pytest.mark.slow
def test_stop_from_another_thread_frees_the_slice_within_10_s(lab: Lab) -> None:
    """Interrupting the run (what Ctrl-C does: SIGINT to the process, here from another thread)
    stops it and raises ``KeyboardInterrupt``; the slice is free again within 10 s.

    Two workers of 4 chips each (the whole slice, as with 8): stopping does not depend on the
    worker count, and 8 torch processes would start for a minute on 2 cores."""
    ns: dict = {}
    exec(TRAIN_CELL, ns)
    started = threading.Event()
    stopped_at: list[float] = []

    def on_records(rows: list[dict]) -> None:
        if any(r.get("step", -1) >= 1 for r in rows):
            started.set()

    def stopper() -> None:
        if started.wait(300):
            stopped_at.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=stopper, daemon=True)
    thread.start()
    try:
        lab.train_torch(ns["train_loop_per_worker"], "2x2x2", "v5p", name="stopme",
                        config={"steps": 500}, chips_per_worker=4, on_records=on_records)
        pytest.fail("the interrupted run returned instead of raising KeyboardInterrupt")
    except KeyboardInterrupt:
        pass
    thread.join(5)
    assert stopped_at, "the run never reached step 1"
    assert wait_until(lambda: _v5p_idle(lab) and not live_placement_groups(), 10)
    freed_s = time.monotonic() - stopped_at[0]
    assert freed_s < 10, f"slice freed {freed_s:.1f} s after the stop"


@pytest.mark.parametrize("line, cell, needle", [
    ("torch --topology 2x2x2 --version v5p --chips-per-worker 3", "def f(config):\n    pass\n",
     "has 8 chips, 4 per host; 3 TPU chip(s) per worker does not divide 4"),
    ("torch --topology 2x2x2 --version v5p", "def f(config, extra):\n    pass\n",
     "cannot be the per-worker training function"),
    ("torch --topology 2x2x2 --version v5p --backend nccl", "def f(config):\n    pass\n",
     "invalid choice: 'nccl'"),
    ("torch --topology 3x3x3 --version v5p", "def f(config):\n    pass\n", "3x3x3"),
])
def test_bad_input_is_refused_before_anything_is_taken(ip, lab: Lab, line: str, cell: str,
                                                      needle: str) -> None:
    text, error = _run(ip, line, cell)
    assert error is not None and needle in text, text
    assert "raytpu_lab/" not in text, text  # one short block, no traceback of our code
    assert not live_placement_groups()


@pytest.mark.parametrize("versions, needle", [
    ({"torch": None, "torch_xla": "2.9.0"}, "need torch, which is not installed: "
                                            "pip install 'raytpu_lab[torch]'"),
    ({"torch": "2.8.0", "torch_xla": "2.9.0"}, "torch 2.8.0 does not match torch_xla 2.9.0"),
])
def test_missing_or_mismatched_torch_is_refused_first(ip, lab: Lab, monkeypatch: pytest.MonkeyPatch,
                                                      versions: dict, needle: str) -> None:
    def version(name: str) -> str:
        if versions.get(name) is None:
            raise torch_checks.metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(torch_checks.metadata, "version", version)
    text, error = _run(ip, "torch --topology 2x2x2 --version v5p", "def f(config):\n    pass\n")
    assert error is not None and needle in text, text
    assert not live_placement_groups()
