"""Ray Serve through ``%%raytpu serve`` in a real kernel against a plain ``serve.run`` script: the
same deployment on the same emulated slice, alternated, measured by a fixed load from a separate
process.

Brings up its own emulated cluster (one v4 ``2x2x1`` slice, one host) under a private
``$RAYTPU_EMULATOR_ROOT`` and a Jupyter kernel (this venv's Python) connected to it with its live
map open (``%raytpu map``: its feed polls the cluster during every load, as in a notebook). Each
round, in turn (the order alternates between rounds):

- **ours**: in the kernel, ``%raytpu reserve 2x2x1 --version v4 --name s1`` and ``%%raytpu serve
  --on s1`` of the deployment; load; ``%raytpu serve delete``, ``%raytpu release s1``;
- **plain**: a separate Python process runs ``serve.run`` of the same class with the same
  placement (``placement_group_bundles=[{"TPU": 4}]``, pinned by ``ray.io/tpu-slice-name``, the
  replica holding the host's chips, HTTP on 127.0.0.1); load; ``serve.delete``.

The load is one more process: ``raytpu_lab.serve.load.run_load`` at ``--rps`` for ``--duration``
seconds (open loop, ``--concurrency`` in flight), the same for both. Prints both sides' medians,
and as the last line ``RESULT {json}``: ``rps_ratio_median`` (ours / plain achieved requests/s;
target >= 0.95), ``p50_latency_ratio_median`` (ours / plain; target <= 1.05), ``rounds``.

Run: ``.venv/bin/python benchmarks/serve_overhead.py [--rounds 5 --rps 40 --duration 8]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

DEPLOYMENT = '''class Echo:
    def __call__(self, request):
        return "hello"
'''

PLAIN = '''
import json, socket, sys
import ray
from ray import serve
from raytpu_lab import _ray_private

address, slice_name, chips = sys.argv[1], sys.argv[2], float(sys.argv[3])
_ray_private.enable_token_auth()  # emulated clusters run with Ray token auth
ray.init(address=address, namespace="serve-bench", logging_level="ERROR")
port = _ray_private.serve_http_port()
if port is None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
''' + DEPLOYMENT + '''
app = serve.deployment(Echo).options(
    num_replicas=1, ray_actor_options={"num_cpus": 0, "resources": {"TPU": chips}},
    placement_group_bundles=[{"TPU": chips}],
    placement_group_bundle_label_selector=[{"ray.io/tpu-slice-name": slice_name}],
    placement_group_strategy="PACK").bind()
serve.run(app, name="plain", route_prefix="/plain")
print(json.dumps({"url": f"http://127.0.0.1:{port}/plain"}), flush=True)
sys.stdin.readline()  # the load ran
serve.delete("plain")
'''

LOAD = '''
import json, sys
from raytpu_lab.serve.load import run_load
url, rps, duration, concurrency = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
run_load(url, rps=rps, duration_s=1.0, concurrency=concurrency)  # warm the route, not counted
print(json.dumps(run_load(url, rps=rps, duration_s=duration, concurrency=concurrency).summary()))
'''


class Kernel:
    """A Jupyter kernel of this interpreter; ``run`` returns a cell's text output and raises on
    an error."""

    def __init__(self) -> None:
        from jupyter_client import KernelManager
        from jupyter_client.kernelspec import KernelSpecManager

        # No kernelspec folders: "python3" is ipykernel's own spec, whose argv is this Python.
        self.km = KernelManager(kernel_name="python3",
                                kernel_spec_manager=KernelSpecManager(kernel_dirs=[]))
        self.km.start_kernel()
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)

    def run(self, code: str, timeout_s: float = 300) -> str:
        out: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            content = msg["content"]
            if msg["msg_type"] == "stream":
                out.append(content["text"])
            elif msg["msg_type"] in ("display_data", "execute_result"):
                out.append(content["data"].get("text/plain", ""))
            elif msg["msg_type"] == "error":
                out.append("\n".join(content["traceback"]))

        reply = self.kc.execute_interactive(code, timeout=timeout_s, output_hook=hook)
        text = "".join(out)
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"cell failed: {code.splitlines()[0]}\n{text[-3000:]}")
        return text

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=False)


def load(url: str, args: argparse.Namespace) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", LOAD, url, str(args.rps), str(args.duration),
                           str(args.concurrency)], capture_output=True, text=True, timeout=300,
                          check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ours(kernel: Kernel, args: argparse.Namespace) -> dict[str, Any]:
    kernel.run("%raytpu reserve 2x2x1 --version v4 --name s1")
    out = kernel.run("%%raytpu serve --on s1 --app echo --route /echo\n" + DEPLOYMENT)
    m = re.search(r"Serving 'echo' at (http://127\.0\.0\.1:\d+/echo)", out)
    assert m, out
    try:
        return load(m[1], args)
    finally:
        kernel.run("%raytpu serve delete echo\n%raytpu release s1")


def plain(address: str, slice_name: str, chips: int, args: argparse.Namespace) -> dict[str, Any]:
    proc = subprocess.Popen([sys.executable, "-c", PLAIN, address, slice_name, str(chips)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        assert line, "the plain serve.run script ended without serving"
        stats = load(json.loads(line)["url"], args)
        proc.stdin.write("done\n")
        proc.stdin.flush()
        proc.wait(timeout=120)
        return stats
    finally:
        if proc.poll() is None:
            proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rps", type=float, default=40.0)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    os.environ.setdefault("RAYTPU_EMULATOR_ROOT", tempfile.mkdtemp(prefix="rtb-"))
    from raytpu_lab.cluster import emulator

    cluster = emulator.up([("v4:2x2x1", 1)], name="bsrv", timeout_s=600)
    kernel = None
    try:
        slice_name, chips = cluster.hosts[0].slice_name, 4
        kernel = Kernel()
        kernel.run(f"%load_ext raytpu_lab\n%raytpu connect {cluster.address}")
        kernel.run("%raytpu map")  # live: the map's feed polls the cluster during every load
        rows: dict[str, list[dict[str, Any]]] = {"ours": [], "plain": []}
        for i in range(args.rounds):
            order = ["ours", "plain"] if i % 2 == 0 else ["plain", "ours"]
            for side in order:
                stats = (ours(kernel, args) if side == "ours"
                         else plain(cluster.address, slice_name, chips, args))
                rows[side].append(stats)
                print(f"round {i} {side:5}: {stats['sent']} sent, {stats['errors']} errors, "
                      f"{stats['achieved_rps']:.1f} req/s, p50 {stats['p50'] * 1000:.1f} ms, "
                      f"p99 {stats['p99'] * 1000:.1f} ms", flush=True)
                time.sleep(1.0)
        rps = [o["achieved_rps"] / p["achieved_rps"] for o, p in zip(rows["ours"], rows["plain"], strict=True)]
        p50 = [o["p50"] / p["p50"] for o, p in zip(rows["ours"], rows["plain"], strict=True)]
        result = {
            "rounds": args.rounds, "rps_asked": args.rps, "duration_s": args.duration,
            "ours_rps_median": round(statistics.median(o["achieved_rps"] for o in rows["ours"]), 2),
            "plain_rps_median": round(statistics.median(p["achieved_rps"] for p in rows["plain"]), 2),
            "ours_p50_ms_median": round(statistics.median(o["p50"] for o in rows["ours"]) * 1000, 2),
            "plain_p50_ms_median": round(statistics.median(p["p50"] for p in rows["plain"]) * 1000, 2),
            "rps_ratio_median": round(statistics.median(rps), 3),
            "p50_latency_ratio_median": round(statistics.median(p50), 3),
            "errors": sum(r["errors"] for side in rows.values() for r in side),
        }
        print(f"ours: {result['ours_rps_median']} req/s, p50 {result['ours_p50_ms_median']} ms; "
              f"plain: {result['plain_rps_median']} req/s, p50 {result['plain_p50_ms_median']} ms")
        print("RESULT " + json.dumps(result))
    finally:
        if kernel is not None:
            kernel.close()
        cluster.down()


if __name__ == "__main__":
    main()
