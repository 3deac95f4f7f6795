"""Cost of a raytpu_lab reservation against a bare ray.util.tpu.slice_placement_group, side by side.

Brings up its own emulated cluster (2 slices of v6e 4x4), then alternates, ``--rounds`` times:
(a) bare ``slice_placement_group("4x4", "v6e")`` until ready, then ``shutdown()``;
(b) ``Lab.reserve("4x4", "v6e")`` (snapshot, head lock, pinned slice placement group) and release.
Also times one snapshot (``fetch_raw_state`` + ``build_snapshot``). Prints medians, the ratio b/a,
and as the last line ``RESULT {json}``. Run: ``.venv/bin/python benchmarks/reserve_overhead.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import ray
from ray.util.tpu import slice_placement_group

from raytpu_lab.lab import Lab


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    os.environ.setdefault("RAYTPU_EMULATOR_ROOT", tempfile.mkdtemp(prefix="raytpu-bench-"))
    lab = Lab()
    lab.up("v6e:4x4", 2, name="bench")
    try:
        bare, ours, snaps = [], [], []
        for i in range(args.rounds):
            t = time.perf_counter()
            handle = slice_placement_group("4x4", "v6e")
            ray.get(handle.placement_group.ready(), timeout=60)
            bare.append(time.perf_counter() - t)
            handle.shutdown()
            time.sleep(0.5)  # let Ray report the freed resources before the next round

            t = time.perf_counter()
            lab.reserve("4x4", "v6e", name=f"b{i}")
            ours.append(time.perf_counter() - t)
            lab.release(f"b{i}")
            time.sleep(0.5)

            t = time.perf_counter()
            lab.snapshot()
            snaps.append(time.perf_counter() - t)
        result = {
            "rounds": args.rounds,
            "bare_slice_pg_median_s": round(statistics.median(bare), 4),
            "raytpu_reserve_median_s": round(statistics.median(ours), 4),
            "ratio_reserve_over_bare": round(statistics.median(ours) / statistics.median(bare), 2),
            "snapshot_median_s": round(statistics.median(snaps), 4),
            "hosts": len(lab.cluster.hosts) if lab.cluster else 0,
        }
        print(f"bare slice_placement_group: median {result['bare_slice_pg_median_s']} s; "
              f"raytpu reserve: median {result['raytpu_reserve_median_s']} s "
              f"(x{result['ratio_reserve_over_bare']}); snapshot {result['snapshot_median_s']} s")
        print("RESULT " + json.dumps(result))
    finally:
        lab.down()


if __name__ == "__main__":
    main()
