"""What the live dashboard costs a training run: the same JaxTrainer job, launched through
``%%raytpu jax`` with its live dashboard in a real Jupyter kernel, against launched from a plain
script with Ray Train's ``JaxTrainer`` and no dashboard; alternated, side by side in one run.

- Its own emulated cluster: one v6e ``4x4`` slice (4 hosts, 16 chips), stopped at the end.
- The job: fixed steps of a jitted matmul on each worker, ``ray.train.report`` every few steps;
  rank 0 times the steps after a warm-up with its own clock and writes steps/s to a file, so both
  launch paths are measured the same way.
- The magic runs in an ipykernel started with jupyter_client: widgets and comms are real. Every
  IOPub message the kernel sends while the cell runs is what a front end would receive; we count
  them and their bytes (JSON content + binary buffers).
- Both paths use ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=0.5`` (what the magic sets for live charts).

``RAYTPU_EMULATOR_ROOT=/tmp/<id> .venv/bin/python benchmarks/training_overhead.py [--pairs 3]``;
last line ``RESULT {json}`` with ``steps_per_s_ratio_median`` (magic / plain, target >= 0.98),
``frontend_bytes_per_s`` and ``frontend_msgs_per_s`` (medians over the magic runs, everything the
cell sent, one-time widget code and the final static copy included) and the live updates alone
(``frontend_live_update_*``: widget ``comm_msg`` traffic while the run streams).
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from jupyter_client.manager import KernelManager

from raytpu_lab.cluster import emulator

CLUSTER = "bench-overhead"
STEPS, WARMUP, INNER, REPORT_EVERY = 60, 5, 12, 3

TRAIN_FN = '''
def train_loop_per_worker(config):
    import json, time
    import jax, jax.numpy as jnp, ray.train
    rank = ray.train.get_context().get_world_rank()
    w = jnp.ones((384, 384)) * 0.001
    x = jax.random.normal(jax.random.PRNGKey(rank), (256, 384))

    @jax.jit
    def step(w, x):
        y = jnp.tanh(x @ w)
        return w - 1e-3 * (x.T @ y) / x.shape[0], jnp.mean(y * y)

    w, loss = step(w, x)
    loss.block_until_ready()  # compile outside the timed steps
    first = None
    for i in range(config["steps"]):
        t0 = time.perf_counter()
        for _ in range(config["inner"]):
            w, loss = step(w, x)
        loss = float(loss)
        if i == config["warmup"]:
            first = time.perf_counter()
        if i % config["report_every"] == 0 or i == config["steps"] - 1:
            print(f"step {i} loss {loss:.5f}")
            ray.train.report({"step": i, "loss": loss, "step_time_s": time.perf_counter() - t0})
    if rank == 0:
        rate = (config["steps"] - 1 - config["warmup"]) / (time.perf_counter() - first)
        with open(config["out"], "w") as f:
            json.dump({"steps_per_s": rate}, f)
'''

PLAIN = '''
import json, os, sys
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
from raytpu_lab.lab import Lab
from ray.train.v2.api.config import RunConfig, ScalingConfig
from ray.train.v2.jax import JaxTrainer
lab = Lab()
lab.connect(sys.argv[1])
{train_fn}
config = json.loads(sys.argv[2])
JaxTrainer(train_loop_per_worker, train_loop_config=config,
           scaling_config=ScalingConfig(use_tpu=True, topology="4x4", accelerator_type="TPU-V6E",
                                        num_workers=4),
           run_config=RunConfig(name=sys.argv[3])).fit()
'''


def _config(out: Path) -> dict:
    return {"steps": STEPS, "warmup": WARMUP, "inner": INNER, "report_every": REPORT_EVERY,
            "out": str(out)}


class Kernel:
    """An ipykernel of this interpreter; runs cells and counts what it sends to a front end."""

    def __init__(self) -> None:
        self.km = KernelManager(kernel_name="python3")
        self.km.kernel_spec_manager.kernel_dirs = []  # ipykernel's built-in spec: sys.executable
        self.km.start_kernel(extra_arguments=["--HistoryManager.enabled=False"])
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def run(self, code: str, timeout_s: float = 600) -> tuple[dict, int, int, float, str]:
        """Execute ``code``; returns (reply content, iopub messages, iopub bytes, seconds, text).

        ``self.by_type`` gets ``{msg_type: [messages, bytes]}`` of the last call.
        """
        msg_id = self.kc.execute(code)
        start = time.monotonic()
        msgs = size = 0
        self.by_type: dict[str, list[int]] = {}
        text: list[str] = []
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=max(1.0, timeout_s - (time.monotonic() - start)))
            except queue.Empty as err:
                raise TimeoutError(f"no kernel output for {timeout_s} s") from err
            if msg["parent_header"].get("msg_id") != msg_id and msg["msg_type"] != "comm_msg":
                continue
            kind = msg["msg_type"]
            if kind == "status":
                if msg["content"]["execution_state"] == "idle":
                    break
                continue
            if kind in ("execute_input",):
                continue
            nbytes = len(json.dumps(msg["content"], default=str)) + sum(
                len(b) for b in msg.get("buffers") or [])
            msgs += 1
            size += nbytes
            # comm_open carries each widget's front-end code (plotly's FigureWidget ships
            # plotly.js, ~4.7 MB, once per figure); the last update_display_data is the static copy.
            kind_key = kind if kind != "comm_msg" else "comm_msg (live updates)"
            counts = self.by_type.setdefault(kind_key, [0, 0])
            counts[0] += 1
            counts[1] += nbytes
            if kind == "stream":
                text.append(msg["content"]["text"])
            elif kind == "error":
                text.append("\n".join(msg["content"]["traceback"]))
        elapsed = time.monotonic() - start
        reply = self.kc.get_shell_msg(timeout=30)["content"]
        return reply, msgs, size, elapsed, "".join(text)

    def stop(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="raytpu-bench-"))
    stale = emulator.find(CLUSTER)
    if stale is not None:
        stale.down()
    cluster = emulator.up([("v6e:4x4", 1)], name=CLUSTER)
    kernel = None
    ratios, rates_bytes, rates_msgs, live_bytes, live_msgs = [], [], [], [], []
    try:
        kernel = Kernel()
        reply, *_, text = kernel.run(
            f"%load_ext raytpu_lab\nfrom raytpu_lab import get_lab\n"
            f"get_lab().connect({cluster.address!r})\n{TRAIN_FN}")
        assert reply["status"] == "ok", text
        plain_script = work / "plain.py"
        plain_script.write_text(PLAIN.format(train_fn=textwrap.dedent(TRAIN_FN)))
        for i in range(args.pairs):
            pair: dict[str, float] = {}
            for mode in (("magic", "plain") if i % 2 == 0 else ("plain", "magic")):
                out = work / f"{mode}-{i}.json"
                name = f"bench-{mode}-{i}"
                if mode == "magic":
                    cell = (f"%%raytpu jax --topology 4x4 --version v6e --name {name} "
                            f"--config \"{_config(out)!r}\"\n{TRAIN_FN}")
                    reply, msgs, size, elapsed, text = kernel.run(cell)
                    assert reply["status"] == "ok", text[-3000:]
                    rates_bytes.append(size / elapsed)
                    rates_msgs.append(msgs / elapsed)
                    live = kernel.by_type.get("comm_msg (live updates)", [0, 0])
                    live_bytes.append(live[1] / elapsed)
                    live_msgs.append(live[0] / elapsed)
                    print(f"  by message type [count, bytes]: {kernel.by_type}", flush=True)
                    print(f"pair {i} magic: {msgs} front-end messages, {size} bytes in "
                          f"{elapsed:.1f} s", flush=True)
                else:
                    start = time.monotonic()
                    proc = subprocess.run(
                        [sys.executable, str(plain_script), cluster.address,
                         json.dumps(_config(out)), name],
                        capture_output=True, text=True, timeout=600)
                    assert proc.returncode == 0, proc.stderr[-3000:]
                    print(f"pair {i} plain: {time.monotonic() - start:.1f} s", flush=True)
                pair[mode] = json.loads(out.read_text())["steps_per_s"]
            ratios.append(pair["magic"] / pair["plain"])
            print(f"pair {i}: magic {pair['magic']:.2f} steps/s, plain {pair['plain']:.2f} steps/s, "
                  f"ratio {ratios[-1]:.3f}", flush=True)
    finally:
        if kernel is not None:
            kernel.stop()
        cluster.down()
    result = {"steps_per_s_ratio_median": round(statistics.median(ratios), 3),
              "ratios": [round(r, 3) for r in ratios],
              "frontend_bytes_per_s": round(statistics.median(rates_bytes)),
              "frontend_msgs_per_s": round(statistics.median(rates_msgs), 2),
              "frontend_live_update_bytes_per_s": round(statistics.median(live_bytes)),
              "frontend_live_update_msgs_per_s": round(statistics.median(live_msgs), 2),
              "steps": STEPS, "pairs": args.pairs, "target_ratio": 0.98}
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
