"""Reservation cost: raytpu_lab's reserve against bare ray.util.tpu.slice_placement_group, side by side.

Brings up its own emulated cluster of 8 v4 2x2x2 slices (two hosts of 4 chips each: 16 hosts),
then:

1. alternately, ``--rounds`` times: (a) bare ``slice_placement_group("2x2x2", "v4")`` plus
   waiting on its placement group's ``ready()``; (b) ``Lab.reserve("2x2x2", "v4")`` until ready
   (snapshot, pick an intact idle slice, head lock, pinned slice placement group). Both are
   released between rounds, untimed, until the snapshot shows every slice idle again;
2. ``Lab.reserve(..., slices=n)`` for n = 1, 2, 4, 8 (``--repeats`` each, median).

Why (b) can be faster than (a): bare ``slice_placement_group`` learns which slice its head lock
won by running a task on that host (``fetch_tpu_slice_name_from_pg``), which starts a worker
process there; (b) picked the slice by name from its snapshot and needs no task.

Prints the medians and, as the last line, ``RESULT {json}`` with ``overhead_ratio_median`` (the
median over rounds of (b)/(a)) and ``reserve_s_by_slices``. Target: overhead ratio <= 1.10.
Run: ``RAYTPU_EMULATOR_ROOT=/tmp/rb .venv/bin/python benchmarks/reservation.py``.
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

SLICES = 8


def _settle(lab: Lab, timeout_s: float = 20.0) -> None:
    """Wait (untimed) until every slice shows idle again."""
    deadline = time.monotonic() + timeout_s
    while len(lab.snapshot().idle_slices("v4-16")) < SLICES and time.monotonic() < deadline:
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("RAYTPU_EMULATOR_ROOT", tempfile.mkdtemp(prefix="rb-", dir="/tmp"))
    lab = Lab()
    t0 = time.perf_counter()
    lab.up("v4:2x2x2", SLICES, name="bench-res", timeout_s=300)
    up_s = time.perf_counter() - t0
    try:
        bare, ours = [], []
        for i in range(args.rounds):
            _settle(lab)
            t = time.perf_counter()
            handle = slice_placement_group("2x2x2", "v4")
            ray.get(handle.placement_group.ready(), timeout=60)
            bare.append(time.perf_counter() - t)
            handle.shutdown()
            _settle(lab)

            t = time.perf_counter()
            lab.reserve("2x2x2", "v4", name=f"b{i}")
            ours.append(time.perf_counter() - t)
            lab.release(f"b{i}")

        by_slices: dict[str, float] = {}
        for n in (1, 2, 4, 8):
            times = []
            for j in range(args.repeats):
                _settle(lab)
                t = time.perf_counter()
                lab.reserve("2x2x2", "v4", slices=n, name=f"n{n}-{j}")
                times.append(time.perf_counter() - t)
                lab.release(f"n{n}-{j}")
            by_slices[str(n)] = round(statistics.median(times), 4)

        ratios = [o / b for o, b in zip(ours, bare, strict=True)]
        result = {
            "overhead_ratio_median": round(statistics.median(ratios), 3),
            "reserve_s_by_slices": by_slices,
            "ratio_of_medians": round(statistics.median(ours) / statistics.median(bare), 3),
            "bare_slice_pg_median_s": round(statistics.median(bare), 4),
            "raytpu_reserve_median_s": round(statistics.median(ours), 4),
            "rounds": args.rounds, "hosts": len(lab.cluster.hosts) if lab.cluster else 0,
            "cluster_up_s": round(up_s, 1),
        }
        print(f"bare slice_placement_group + ready(): median {result['bare_slice_pg_median_s']} s; "
              f"raytpu reserve: median {result['raytpu_reserve_median_s']} s; per-round ratio "
              f"median x{result['overhead_ratio_median']} (target <= 1.10)")
        print(f"reserve time by slices: {by_slices}")
        print("RESULT " + json.dumps(result))
    finally:
        lab.down()


if __name__ == "__main__":
    main()
