"""Pod scale on one machine: KubeRay's v6e-256 sample (64 hosts, 256 chips) on the emulator.

1. ``raytpu up --manifest tests/fixtures/kuberay_samples/ray-cluster.tpu-v6e-256-multihost.yaml``
   (the shell command, as a user runs it), timed;
2. a notebook-style session connects: the snapshot (what the map and ``status`` draw) shows 64
   hosts of one v6e-256 slice, intact;
3. ``reserve 16x16 --version v6e`` holds all 64 hosts;
4. a per-host cell (``run_on``, without JAX: 64 JAX processes do not fit next to the cluster in
   24 GB) returns 64 values in worker-id order;
5. release, ``raytpu down``; nothing of the cluster is left.

Last line ``RESULT {json}``: ``up_s``, ``hosts_in_snapshot``, ``hosts_reserved``,
``cell_values_in_worker_order``, ``processes_left``.
Run: ``RAYTPU_EMULATOR_ROOT=/tmp/rtbench .venv/bin/python benchmarks/emulator_pod.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "tests" / "fixtures" / "kuberay_samples" / "ray-cluster.tpu-v6e-256-multihost.yaml"


def main() -> None:
    os.environ.setdefault("RAYTPU_EMULATOR_ROOT", "/tmp/rtbench")
    cli = [sys.executable, "-c", "import sys; from raytpu_lab.cli import main; sys.exit(main())"]
    cmd = [*cli, "up", "--manifest", str(MANIFEST), "--timeout", "1500"]
    start = time.monotonic()
    up = subprocess.run(cmd, capture_output=True, text=True)
    up_s = time.monotonic() - start
    print(up.stdout, up.stderr[-3000:], flush=True)
    result: dict[str, object] = {"up_s": round(up_s, 1)}
    from raytpu_lab.cluster import emulator
    from raytpu_lab.lab import Lab

    clusters = emulator.running()
    cluster = next((c for c in clusters if len(c.hosts) == 64), None)
    if up.returncode != 0 or cluster is None:
        result["error"] = "up failed"
        print("RESULT " + json.dumps(result), flush=True)
        return
    folder = cluster.folder
    try:
        lab = Lab()
        lab.connect(cluster.address)
        snap = lab.snapshot()
        result["hosts_in_snapshot"] = sum(s.hosts_alive for s in snap.slices)
        result["slices"] = [(s.name, s.pod_type, s.health) for s in snap.slices]
        res = lab.reserve("16x16", "v6e", name="pod", timeout_s=300)
        result["hosts_reserved"] = len(res.placement_group.bundle_specs)
        session = lab.slice_session("pod", init_jax=False, timeout_s=600)
        values = session.run("import os\nint(os.environ['TPU_WORKER_ID'])").values
        result["cell_values_in_worker_order"] = values == list(range(64))
        lab.release("pod")
        lab.down()
    except Exception as err:  # said in the RESULT line, after the cluster is down
        import traceback

        traceback.print_exc()
        result["error"] = f"{type(err).__name__}: {str(err)[:600]}"
    finally:
        import ray

        ray.shutdown()  # before the cluster goes: a connected driver would outwait its GCS
        subprocess.run([*cli, "down", "--name", cluster.name])
    time.sleep(2.0)
    from raytpu_lab.cluster import _process_groups

    left = 0
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            # By command line, or by the cluster's marker in the environment (Ray's agents and
            # workers rename themselves, e.g. ray::DashboardAgent)
            if f"{folder}/" in " ".join(proc.info["cmdline"] or []) \
                    or _process_groups.in_cluster(proc.pid, str(folder)):
                left += 1
        except psutil.Error:
            continue
    result["processes_left"] = left
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
