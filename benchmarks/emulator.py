"""Emulator start time and memory, side by side with Ray's own ``ray.cluster_utils.Cluster``.

For 8, 64, 16 and 32 hosts (in that order; one v6e slice each: 4x8, 16x16, 8x8, 8x16, 4 chips a
host), in one run, alternating:

1. ours: ``emulator.up`` until every node registered (``up`` returns then); a driver connects
   (``ray.init``), then the memory (PSS) of every process of the cluster is summed and divided
   by the hosts; ``down``;
2. the anchor: ``ray.cluster_utils.Cluster`` (in a subprocess) starting a head and adding the
   same nodes and resources (``num_cpus=4``, ``{"TPU": 4, <slice>: 1}``, 128 MiB object store)
   with ``add_node(wait=True)``, as Ray's own tests do.

After the first size, 10 starts of 2 x v6e 4x4 (8 hosts) while 4 busy-loop processes run
(started and stopped here), each followed by ``down``.

Prints progress and a ``PARTIAL {json}`` line after each size, then as the last line ``RESULT {json}`` with ``up_s_by_hosts``,
``anchor_up_s_by_hosts``, ``up_ratio_8`` (ours / anchor at 8 hosts), ``mb_per_host`` (at the
largest cluster started) and ``mb_per_host_by_hosts``, ``hosts_max_started``,
``starts_ok_under_load`` / ``starts_tried_under_load``.
Targets: ``mb_per_host <= 130``, ``up_ratio_8 <= 1.0``, ``hosts_max_started >= 64``,
``starts_ok_under_load == 10``.

Run (it takes a while; it holds the machine):
``RAYTPU_EMULATOR_ROOT=/tmp/rtbench .venv/bin/python benchmarks/emulator.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import psutil

SHAPES = {8: "v6e:4x8", 16: "v6e:8x8", 32: "v6e:8x16", 64: "v6e:16x16"}


def _cluster_pss_mb(pgids: set[int]) -> float:
    """Sum of PSS (MB) of every process in the cluster's process groups (Ray workers included)."""
    total = 0.0
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) in pgids:
                total += proc.memory_full_info().pss / 2**20
        except (psutil.Error, OSError):
            continue
    return total


def ours(hosts: int, timeout_s: float) -> tuple[float, float]:
    """(seconds to start, MB per host with a driver connected)."""
    import ray

    from raytpu_lab import _ray_private
    from raytpu_lab.cluster import emulator

    start = time.monotonic()
    cluster = emulator.up([(SHAPES[hosts], 1)], name="bench", timeout_s=timeout_s)
    up_s = time.monotonic() - start
    try:
        _ray_private.enable_token_auth()
        ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
        time.sleep(5.0)  # let the driver's connection settle everywhere
        # The hosts', the head's and the agent fork server's groups (it holds the hosts' agents).
        pgids = {h.pid for h in cluster.hosts} | {cluster.head_pid, cluster.agents_pid}
        mb = _cluster_pss_mb(pgids) / hosts
    finally:
        ray.shutdown()
        cluster.down()
    return up_s, mb


_ANCHOR = r"""
import sys, time
from ray.cluster_utils import Cluster
hosts, temp = int(sys.argv[1]), sys.argv[2]
start = time.monotonic()
c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "temp_dir": temp})
for i in range(hosts):
    c.add_node(num_cpus=4, resources={"TPU": 4, "tpu-anchor-0": 1},
               object_store_memory=128 * 1024 * 1024, temp_dir=temp)
print("UP_S", time.monotonic() - start, flush=True)
c.shutdown()
"""


def anchor(hosts: int, root: str) -> float:
    temp = os.path.join(root, "anchor")
    # Cluster writes Ray's "current cluster" file under $RAY_TMPDIR/ray: keep it in our root.
    os.makedirs(os.path.join(root, "ray"), exist_ok=True)
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_TMPDIR": root}
    out = subprocess.run([sys.executable, "-c", _ANCHOR, str(hosts), temp], env=env,
                         capture_output=True, text=True, timeout=1800)
    for line in out.stdout.splitlines():
        if line.startswith("UP_S "):
            return float(line.split()[1])
    raise RuntimeError(f"anchor with {hosts} hosts failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")


def under_load(tries: int, timeout_s: float) -> int:
    from raytpu_lab.cluster import emulator

    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(4)]
    ok = 0
    try:
        for i in range(tries):
            start = time.monotonic()
            try:
                cluster = emulator.up([("v6e:4x4", 2)], name="bench-load", timeout_s=timeout_s)
            except Exception as exc:  # a failed start is what is counted here
                print(f"under load {i + 1}/{tries}: FAILED after {time.monotonic() - start:.0f} s: "
                      f"{str(exc)[:600]}", flush=True)
                continue
            ok += 1
            print(f"under load {i + 1}/{tries}: up in {time.monotonic() - start:.1f} s", flush=True)
            cluster.down()
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    return ok


def _result(up_s: dict[int, float], anchor_s: dict[int, float], mb: dict[int, float],
            ok: int, tried: int) -> dict[str, object]:
    biggest = max(mb) if mb else 0
    return {
        "up_s_by_hosts": {h: round(s, 1) for h, s in sorted(up_s.items())},
        "anchor_up_s_by_hosts": {h: round(s, 1) for h, s in sorted(anchor_s.items())},
        "up_ratio_8": round(up_s[8] / anchor_s[8], 3) if 8 in up_s and 8 in anchor_s else None,
        "mb_per_host": round(mb[biggest], 1) if mb else None,
        "mb_per_host_by_hosts": {h: round(m, 1) for h, m in sorted(mb.items())},
        "hosts_max_started": max(up_s) if up_s else 0,
        "starts_ok_under_load": ok,
        "starts_tried_under_load": tried,
        "cores": os.cpu_count(),
        "load_avg_now": round(os.getloadavg()[0], 1),
    }


class _Skipped(Exception):
    """This part of the run was left out (``--only``)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="8,64,16,32",
                        help="host counts, in the order run (default 8,64,16,32; the starts "
                             "under load run after the first)")
    parser.add_argument("--load-tries", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per start")
    parser.add_argument("--only", choices=["ours", "anchor"], default=None,
                        help="run only our starts or only the anchor's (to split a long run into "
                             "several shorter ones; merge their RESULT lines by hand)")
    args = parser.parse_args()
    root = os.environ.setdefault("RAYTPU_EMULATOR_ROOT", "/tmp/rtbench")
    os.makedirs(root, exist_ok=True)
    up_s: dict[int, float] = {}
    anchor_s: dict[int, float] = {}
    mb: dict[int, float] = {}
    ok = 0
    tried = 0
    for n, hosts in enumerate(int(h) for h in args.hosts.split(",")):
        try:
            if args.only == "anchor":
                raise _Skipped
            up_s[hosts], mb[hosts] = ours(hosts, args.timeout)
            print(f"ours   {hosts:3d} hosts: up {up_s[hosts]:6.1f} s, {mb[hosts]:5.0f} MB/host",
                  flush=True)
        except _Skipped:
            pass
        except Exception as exc:
            print(f"ours   {hosts:3d} hosts: FAILED {str(exc)[:800]}", flush=True)
        try:
            if args.only == "ours":
                raise _Skipped
            anchor_s[hosts] = anchor(hosts, root)
            print(f"anchor {hosts:3d} hosts: up {anchor_s[hosts]:6.1f} s", flush=True)
        except _Skipped:
            pass
        except Exception as exc:
            print(f"anchor {hosts:3d} hosts: FAILED {str(exc)[:800]}", flush=True)
        if n == 0 and args.load_tries and args.only != "anchor":
            tried = args.load_tries
            ok = under_load(tried, args.timeout)
        # Partial results as they come (a long run can be cut short).
        print("PARTIAL " + json.dumps(_result(up_s, anchor_s, mb, ok, tried)), flush=True)
    print("RESULT " + json.dumps(_result(up_s, anchor_s, mb, ok, tried)), flush=True)


if __name__ == "__main__":
    main()
