"""Cost of one live-map refresh at pod scale: raw Ray state -> snapshot -> the widget's message.

Synthetic raw states (:mod:`raytpu_lab.state.synthetic`, the shape ``fetch_raw_state`` returns):

- v6e 16x16 slices (64 hosts of 4 chips each): 4, 16 and 64 slices = 256, 1,024 and 4,096 hosts
  (1x, 4x, 16x), to show that the cost grows linearly with hosts.
- A full v5p pod of 8,960 chips = 2,240 hosts, as Ray 2.60 can label it. Ray's table has no single
  topology of 8,960 chips (its v5p maximum is 16x16x24 = 6,144 chips, and 8,960 / 64 = 140 cubes
  needs a side of 7 cubes), so the pod is three slices: 16x16x24 + 16x16x8 + 8x8x12. (The pod
  type "v5p-8960" counts TensorCores: 4,480 chips = 1,120 hosts, which no single Ray topology
  has either.)

A refresh is timed from the raw state to the JSON text of what ``TopologyMap.send`` gets:
``build_snapshot`` + ``TopologyMap.update`` (diff) + ``json.dumps`` of the delta. Refreshes
alternate between the idle state and one with 1% of hosts busy, so each one sends a real delta;
"unchanged" refreshes (the common case) are timed too. Times are the benchmark thread's CPU
time (``time.thread_time``): on a shared 2-core machine wall time mostly measures the scheduler;
the median wall time and the load average are in the RESULT line too. ``fetch_ms_live`` times ``lab.snapshot()``
(``fetch_raw_state`` + ``build_snapshot``) on a live emulated cluster of 2 slices of v6e 4x4 (head +
8 hosts); ``--no-live`` skips it. Last line: ``RESULT {json}``.

Run: ``.venv/bin/python benchmarks/topology_map.py [--rounds 15] [--no-live]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import tempfile
import time
from typing import Any

from raytpu_lab.errors import EmulatorError
from raytpu_lab.state.model import build_snapshot
from raytpu_lab.state.synthetic import mark_busy, synthetic_raw_state
from raytpu_lab.widgets.topology_map import TopologyMap

TARGET_REFRESH_MS = 50.0
TARGET_UPDATE_BYTES = 64 * 1024
V6E_SIZES = {256: [("v6e:16x16", 4)], 1024: [("v6e:16x16", 16)], 4096: [("v6e:16x16", 64)]}
V5P_POD = [("v5p:16x16x24", 1), ("v5p:16x16x8", 1), ("v5p:8x8x12", 1)]


def _wire_bytes(msg: Any) -> int:
    # jupyter_client's json_packer: json.dumps(..., ensure_ascii=False), UTF-8 on the wire.
    return len(json.dumps(msg, ensure_ascii=False).encode())


def measure(slices: list[tuple[str, int]], rounds: int) -> dict[str, Any]:
    """Time refreshes of one synthetic cluster; sizes of the messages."""
    idle = synthetic_raw_state(slices)
    busy = mark_busy(idle, 0.01, seed=1)
    widget = TopologyMap(build_snapshot(idle))
    sent: list[dict[str, Any]] = []
    widget.send = lambda content, buffers=None: sent.append(content)  # type: ignore[method-assign]
    hosts = sum(len(s.hosts) for s in widget.snapshot.slices) if widget.snapshot else 0
    changed, wall, unchanged, build, delta_bytes = [], [], [], [], []
    gc.collect()
    for i in range(rounds):
        raw = busy if i % 2 == 0 else idle
        sent.clear()
        w0, t0 = time.perf_counter(), time.thread_time()
        snap = build_snapshot(raw)
        t1 = time.thread_time()
        widget.update(snap)
        wire = [json.dumps(m, ensure_ascii=False).encode() for m in sent]
        t2, w2 = time.thread_time(), time.perf_counter()
        changed.append((t2 - t0) * 1e3)
        wall.append((w2 - w0) * 1e3)
        build.append((t1 - t0) * 1e3)
        assert len(sent) == 1 and sent[0]["type"] == "delta", sent[:1]
        delta_bytes.append(sum(len(w) for w in wire))
        sent.clear()
        t0 = time.thread_time()
        widget.update(build_snapshot(raw))
        unchanged.append((time.thread_time() - t0) * 1e3)
        assert not sent
    full_bytes = _wire_bytes(widget._full_message())
    geometry_bytes = _wire_bytes(widget.geometry)
    changed_hosts = sum(1 for a, b in zip(idle["nodes"], busy["nodes"], strict=True) if a is not b)
    widget.close()
    return {
        "hosts": hosts, "hosts_changed": changed_hosts,
        "refresh_ms": round(statistics.median(changed), 2),
        "refresh_wall_ms": round(statistics.median(wall), 2),
        "refresh_ms_unchanged": round(statistics.median(unchanged), 2),
        "build_snapshot_ms": round(statistics.median(build), 2),
        "update_bytes_1pct": max(delta_bytes),
        "full_state_bytes": full_bytes, "geometry_bytes": geometry_bytes,
    }


def fetch_live(rounds: int = 20) -> float:
    """Median ms of ``lab.snapshot()`` on a fresh emulated 2-slice v6e 4x4 cluster."""
    from raytpu_lab.lab import Lab  # imports Ray; only for the live part

    os.environ["RAYTPU_EMULATOR_ROOT"] = tempfile.mkdtemp(prefix="rtb-", dir="/tmp")
    lab = Lab()
    lab.up("v6e:4x4", 2, name="bench-map")
    try:
        lab.snapshot()
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            lab.snapshot()
            times.append((time.perf_counter() - t0) * 1e3)
        return round(statistics.median(times), 2)
    finally:
        lab.down()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="refreshes timed per size")
    parser.add_argument("--no-live", action="store_true", help="skip the emulated-cluster fetch")
    args = parser.parse_args()

    rows = {n: measure(spec, args.rounds) for n, spec in V6E_SIZES.items()}
    pod = measure(V5P_POD, args.rounds)
    print(f"{'cluster':<34}{'hosts':>6}{'refresh ms':>12}{'(build)':>9}{'unchanged':>11}"
          f"{'1% delta B':>12}{'full B':>10}")
    labelled = [(f"v6e 16x16 x{n // 64} ({n // 256}x)", r) for n, r in rows.items()]
    labelled.append(("v5p pod 8,960 chips (3 slices)", pod))
    for label, r in labelled:
        print(f"{label:<34}{r['hosts']:>6}{r['refresh_ms']:>12}{r['build_snapshot_ms']:>9}"
              f"{r['refresh_ms_unchanged']:>11}{r['update_bytes_1pct']:>12}"
              f"{r['full_state_bytes']:>10}")
    base = rows[256]["refresh_ms"]
    per_host = [round(r["refresh_ms"] / r["hosts"] * 1000, 2) for r in rows.values()]
    print(f"growth: refresh 1x/4x/16x = {base} / {rows[1024]['refresh_ms']} / "
          f"{rows[4096]['refresh_ms']} ms; per 1,000 hosts {per_host} ms (flat = linear)")
    big = rows[4096]
    print(f"targets at 4,096 hosts: refresh {big['refresh_ms']} ms (<= {TARGET_REFRESH_MS}) "
          f"{'ok' if big['refresh_ms'] <= TARGET_REFRESH_MS else 'MISSED'}; 1% update "
          f"{big['update_bytes_1pct']} B (<= {TARGET_UPDATE_BYTES}) "
          f"{'ok' if big['update_bytes_1pct'] <= TARGET_UPDATE_BYTES else 'MISSED'}")

    fetch_ms, fetch_error = None, None
    if not args.no_live:
        try:
            fetch_ms = fetch_live()
            print(f"live emulated cluster (head + 8 hosts): lab.snapshot() median {fetch_ms} ms")
        except EmulatorError as err:  # e.g. an overloaded machine; the synthetic results stand
            fetch_error = err.what
            print(f"live emulated cluster could not start: {err}")
    result = {
        "refresh_ms_4096": big["refresh_ms"],
        "update_bytes_1pct_4096": big["update_bytes_1pct"],
        "fetch_ms_live": fetch_ms,
        **({"fetch_error": fetch_error} if fetch_error else {}),
        "hosts_sizes": [r["hosts"] for r in rows.values()],
        "refresh_ms_by_size": [r["refresh_ms"] for r in rows.values()],
        "build_snapshot_ms_4096": big["build_snapshot_ms"],
        "refresh_ms_unchanged_4096": big["refresh_ms_unchanged"],
        "refresh_wall_ms_4096": big["refresh_wall_ms"], "load_avg_1m": os.getloadavg()[0],
        "full_state_bytes_4096": big["full_state_bytes"],
        "v5p_pod_hosts": pod["hosts"], "refresh_ms_v5p_pod": pod["refresh_ms"],
        "update_bytes_1pct_v5p_pod": pod["update_bytes_1pct"],
    }
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
