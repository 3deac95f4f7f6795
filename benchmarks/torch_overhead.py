"""Cost of ``%%raytpu torch`` against a plain script calling ``TorchTrainer`` directly, side by side.

Brings up its own emulated v5p 2x2x2 (2 hosts x 4 chips), then alternates, ``--rounds`` times:
(a) plain: ``TorchTrainer(train_fn, torch_config=TorchXlaConfig(backend="gloo", pjrt_device="CPU"),
ScalingConfig(use_tpu=True, topology="2x2x2", accelerator_type="TPU-V5P", num_workers=8,
resources_per_worker={"TPU": 1})).fit()``: no callbacks, no report queue, no placement or XLA
reports, no snapshot polling (the ``TorchXlaConfig`` is needed by both: Ray 2.60's own Torch
backend wants torch_tpu on TPU workers, see :mod:`raytpu_lab.train.torch_backend`);
(b) the same function through an IPython ``InteractiveShell`` running ``%%raytpu torch`` (live
chart, report streaming, placement and XLA-metrics reports, snapshot polling).

Steps/s is measured inside rank 0's loop (after ``--warmup`` steps, so compiles and worker start
are excluded), reported in its last report and written to a file (Ray Train v2's ``Result`` keeps
no metrics without a checkpoint, so the plain side reads the file; the magic side checks both). Both runs use the same
``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`` (how long ``ray.train.report`` may block). Prints each
round, the medians and, as the last line, ``RESULT {json}`` with ``steps_per_s_ratio_median``
(magic / plain, per round). Run it under the CPU lock:
``RAYTPU_EMULATOR_ROOT=/tmp/x flock /tmp/raytpu-cpu.lock .venv/bin/python benchmarks/torch_overhead.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

TRAIN_FN = '''
def train_loop_per_worker(config):
    import time

    import ray.train
    import torch
    from sklearn.datasets import load_digits

    from raytpu_lab.train import torch_xla_utils as txu

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    x_all, y_all = load_digits(return_X_y=True)
    x = torch.tensor(x_all[rank::world] / 16.0, dtype=torch.float32)
    y = torch.tensor(y_all[rank::world])
    dev = txu.device()
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 10)).to(dev)
    txu.broadcast_parameters(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    t_start = None
    for step in range(config["steps"]):
        idx = torch.randint(0, len(x), (32,), generator=gen)
        loss = torch.nn.functional.cross_entropy(model(x[idx].to(dev)), y[idx].to(dev))
        opt.zero_grad()
        loss.backward()
        txu.optimizer_step(opt, model)
        if step + 1 == config["warmup"]:
            loss.item()
            t_start = time.perf_counter()
        if (step + 1) % config["report_every"] == 0 or step + 1 == config["steps"]:
            metrics = {"step": step, "loss": loss.item()}
            if step + 1 == config["steps"]:
                metrics["loop_steps_per_s"] = (step + 1 - config["warmup"]) / (
                    time.perf_counter() - t_start)
                if rank == 0:  # Ray Train v2 keeps no metrics without checkpoints: leave a file
                    with open(config["out"], "w") as f:
                        f.write(str(metrics["loop_steps_per_s"]))
            ray.train.report(metrics)
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--report-every", type=int, default=10)
    args = parser.parse_args()
    own_root = None
    if "RAYTPU_EMULATOR_ROOT" not in os.environ:
        own_root = os.environ["RAYTPU_EMULATOR_ROOT"] = tempfile.mkdtemp(prefix="rtb-", dir="/tmp")
    # The launcher sets it when unset; set it for both sides so reports block equally long.
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
    storage = tempfile.mkdtemp(prefix="raytpu-torch-bench-")
    out = os.path.join(storage, "loop_steps_per_s")
    config = {"steps": args.steps, "warmup": args.warmup, "report_every": args.report_every,
              "out": out}

    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output
    from ray.train.v2.api.config import RunConfig, ScalingConfig
    from ray.train.v2.torch.torch_trainer import TorchTrainer

    from raytpu_lab.lab import get_lab
    from raytpu_lab.train.torch_backend import TorchXlaConfig

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "raytpu_lab")
    ns: dict = {}
    exec(TRAIN_FN, ns)
    lab = get_lab()
    lab.up("v5p:2x2x2", 1, name="tbench")
    try:
        def plain(i: int) -> float:
            trainer = TorchTrainer(
                ns["train_loop_per_worker"], train_loop_config=config,
                torch_config=TorchXlaConfig(backend="gloo", pjrt_device="CPU"),
                scaling_config=ScalingConfig(use_tpu=True, topology="2x2x2",
                                             accelerator_type="TPU-V5P", num_workers=8,
                                             resources_per_worker={"TPU": 1}),
                run_config=RunConfig(name=f"plain{i}", storage_path=storage))
            trainer.fit()
            with open(out) as f:
                return float(f.read())

        def magic(i: int) -> float:
            line = (f"%%raytpu torch --topology 2x2x2 --version v5p --name magic{i} "
                    f"--storage {storage} --config \"{config!r}\"")
            with capture_output() as captured:
                result = shell.run_cell(f"{line}\n{TRAIN_FN}", store_history=False)
            if result.error_in_exec is not None:
                raise RuntimeError(captured.stdout + captured.stderr)
            with open(out) as f:
                measured = float(f.read())
            assert measured == shell.user_ns["last_run"].final_metrics["loop_steps_per_s"]
            return measured

        plain_sps, magic_sps, ratios, walls = [], [], [], {"plain": [], "magic": []}
        for i in range(args.rounds):
            for name, run, into in (("plain", plain, plain_sps), ("magic", magic, magic_sps)):
                t = time.perf_counter()
                into.append(run(i))
                walls[name].append(time.perf_counter() - t)
                time.sleep(1.0)  # let Ray report the freed slice before the next run
            ratios.append(magic_sps[-1] / plain_sps[-1])
            print(f"round {i}: plain {plain_sps[-1]:.2f} steps/s ({walls['plain'][-1]:.0f} s wall), "
                  f"magic {magic_sps[-1]:.2f} steps/s ({walls['magic'][-1]:.0f} s wall), "
                  f"ratio {ratios[-1]:.3f}", flush=True)
        result = {
            "rounds": args.rounds, "workers": 8, "steps": args.steps, "warmup": args.warmup,
            "plain_steps_per_s_median": round(statistics.median(plain_sps), 2),
            "magic_steps_per_s_median": round(statistics.median(magic_sps), 2),
            "steps_per_s_ratio_median": round(statistics.median(ratios), 3),
            "steps_per_s_ratios": [round(r, 3) for r in ratios],
            "plain_wall_median_s": round(statistics.median(walls["plain"]), 1),
            "magic_wall_median_s": round(statistics.median(walls["magic"]), 1),
        }
        print("RESULT " + json.dumps(result))
    finally:
        lab.down()
        shutil.rmtree(storage, ignore_errors=True)
        if own_root:
            shutil.rmtree(own_root, ignore_errors=True)


if __name__ == "__main__":
    main()
