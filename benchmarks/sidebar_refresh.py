"""The sidebar's server-side diff path on a synthetic 4,096-host pod (issue 15's load targets).

One ClusterFeed (the server's, :mod:`raytpu_lab.jupyter.feed`) is fed a synthetic raw state of
4,096 v6e hosts (16 slices of v6e:16x16 = 64 hosts... see SPECS), then states where 1% of the hosts
changed (busy <-> free). Measured side by side in one run: ms per refresh with nothing changed,
ms per refresh with 1% changed, and the bytes (JSON) of the revision a client receives for a 1%
change, next to the bytes of a full state. Targets: <= 100 ms per refresh, <= 64 KB per 1% change.

    PYTHONPATH=. python benchmarks/sidebar_refresh.py

Last line: ``RESULT {json}``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from raytpu_lab.jupyter.feed import ClusterFeed
from raytpu_lab.state.model import build_snapshot
from raytpu_lab.state.synthetic import mark_busy, synthetic_raw_state

SPECS = [("v6e:16x16", 64)]  # 64 slices x 64 hosts = 4,096 hosts (v6e: 4 chips per host)
ROUNDS = 10


def main() -> int:
    base = synthetic_raw_state(SPECS)
    hosts = sum(1 for n in base["nodes"] if n["resources_total"].get("TPU"))
    feed = ClusterFeed()
    t = time.perf_counter()
    feed.apply(base, {}, [], now=0.0)
    first_ms = (time.perf_counter() - t) * 1000
    full_bytes = len(json.dumps(feed.full(), separators=(",", ":")))
    same_ms, change_ms, change_bytes, model_ms = [], [], [], []
    for i in range(ROUNDS):
        t = time.perf_counter()
        build_snapshot(base)  # the pure model alone (the widget pays it too), side by side
        model_ms.append((time.perf_counter() - t) * 1000)
        t = time.perf_counter()
        none = feed.apply(base, {}, [], now=2.0 * i + 1)
        same_ms.append((time.perf_counter() - t) * 1000)
        assert none is None or "map" not in none or not none["map"], "no change must send no map"
        changed = mark_busy(base, 0.01, seed=i)
        t = time.perf_counter()
        update = feed.apply(changed, {}, [], now=2.0 * i + 2)
        change_ms.append((time.perf_counter() - t) * 1000)
        assert update is not None
        change_bytes.append(len(json.dumps(update, separators=(",", ":"))))
        feed.apply(base, {}, [], now=2.0 * i + 2.5)  # back to idle for the next round
    result = {
        "hosts": hosts, "first_ms": round(first_ms, 1),
        "refresh_unchanged_ms": round(statistics.median(same_ms), 1),
        "refresh_1pct_ms": round(statistics.median(change_ms), 1),
        "of_which_model_ms": round(statistics.median(model_ms), 1),
        "bytes_per_1pct_change": int(statistics.median(change_bytes)),
        "full_state_bytes": full_bytes,
        "targets": {"refresh_ms": 100, "bytes_per_1pct_change": 64 * 1024},
    }
    print(f"{hosts} hosts: refresh {result['refresh_unchanged_ms']} ms unchanged, "
          f"{result['refresh_1pct_ms']} ms with 1% changed (the shared state model alone: "
          f"{result['of_which_model_ms']} ms); a 1% change sends "
          f"{result['bytes_per_1pct_change']} B (full state {full_bytes} B)")
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
