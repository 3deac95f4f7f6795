"""Reservations under contention and across drivers: separate driver processes, real Ray.

The session cluster's three v4 2x2x2 slices (two hosts each) are raced for by 8 drivers; a
driver killed with SIGKILL frees its slice; a detached reservation outlives its driver and is
listed, attached and released by name from this one.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from IPython import get_ipython
from IPython.testing.globalipapp import start_ipython
from IPython.utils.capture import capture_output

from raytpu_lab.cluster import emulator
from raytpu_lab.lab import Lab

from . import _driver
from .conftest import live_placement_groups, wait_until

V4 = "v4-16"
V4_SLICES = ["tpu-v4-2x2x2-0", "tpu-v4-2x2x2-1", "tpu-v4-2x2x2-2"]


@pytest.mark.slow
def test_eight_drivers_race_for_three_slices_exactly_three_win(
        lab: Lab, cluster: emulator.EmulatedCluster) -> None:
    timeout_s = 6.0
    start_at = time.time() + 25  # every driver imports Ray and connects first (2 cores)
    procs = [_driver.start("reserve", cluster.address, f"race{i}", "--timeout", str(timeout_s),
                           "--hold-s", "-1", "--start-at", str(start_at)) for i in range(8)]
    try:
        results = [_driver.result(p, timeout_s=90) for p in procs]
        won = [r for r in results if r["ok"]]
        lost = [r for r in results if not r["ok"]]
        print(f"contention: {len(won)} won, {len(lost)} failed; "
              f"elapsed {[r['elapsed_s'] for r in results]}")
        assert len(won) == 3, results
        assert sorted(s for r in won for s in r["slices"]) == V4_SLICES  # three different slices
        for r in lost:
            assert r["elapsed_s"] < timeout_s + 5, r
            assert r["slices_idle"] == 0
            assert set(r["reasons"]) == set(V4_SLICES)
            assert all(why.startswith("held by race") for why in r["reasons"].values()), r
            assert "No 1 idle slice(s) of v4-16" in r["error"] and "What to do" in r["error"]

        # Each winner holds every host of its slice; the only groups left are the winners'.
        snap = lab.snapshot()
        for r in won:
            (name,) = r["slices"]
            assert snap.slice(name).owners == [r["name"]]
            assert all(h.state == "reserved" for h in snap.slice(name).hosts)
        names = sorted(pg["name"] for pg in live_placement_groups())
        assert names == sorted([f"raytpu:{r['name']}" for r in won]
                               + [f"raytpu:{r['name']}:head:{r['slices'][0]}" for r in won])
    finally:
        for p in procs:
            if p.poll() is None and p.stdin is not None:
                p.stdin.write("release\n")
                p.stdin.flush()
        for p in procs:
            try:
                p.wait(timeout=30)
            except Exception:
                p.kill()
    assert wait_until(lambda: not live_placement_groups(), 10)
    assert wait_until(lambda: len(lab.snapshot().idle_slices(V4)) == 3, 10)


def test_a_killed_driver_frees_its_slice_within_10_s(
        lab: Lab, cluster: emulator.EmulatedCluster) -> None:
    proc = _driver.start("reserve", cluster.address, "doomed", "--timeout", "20", "--hold-s", "120")
    held = _driver.result(proc)
    assert held["ok"], held
    (slice_name,) = held["slices"]
    assert lab.snapshot().slice(slice_name).owners == ["doomed"]
    os.kill(proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    assert wait_until(lambda: lab.snapshot().slice(slice_name).idle, 10), \
        lab.snapshot().slice(slice_name)
    print(f"slice free {time.monotonic() - killed:.1f} s after SIGKILL")
    proc.wait(timeout=10)
    assert not live_placement_groups()


def test_a_detached_reservation_survives_its_driver_and_is_attached_and_released_by_name(
        lab: Lab, cluster: emulator.EmulatedCluster) -> None:
    procs = [_driver.start("reserve", cluster.address, name, "--detached", "--timeout", "20")
             for name in ("kept", "kept2")]
    made = {r["name"]: r for r in (_driver.result(p) for p in procs)}
    try:
        assert all(r["ok"] for r in made.values()), made
        assert all(p.wait(timeout=30) == 0 for p in procs)  # the drivers are gone

        listed = {r.name: r for r in lab.cluster_reservations()}
        assert set(listed) == {"kept", "kept2"}
        assert listed["kept"].detached is True and listed["kept"].slice_names == made["kept"]["slices"]
        assert listed["kept"].num_hosts == 2 and listed["kept"].chips == 8
        assert set(listed["kept"].head_locks) == set(made["kept"]["slices"])

        ip = start_ipython() or get_ipython()  # one global shell per process
        ip.run_line_magic("load_ext", "raytpu_lab")
        with capture_output() as out:
            ip.run_cell("%raytpu reservations --all", store_history=False)
        assert "kept: v4-16 2x2x2 on " + made["kept"]["slices"][0] in out.stdout, out.stdout
        assert "detached" in out.stdout

        with capture_output() as out:
            ip.run_cell("%raytpu attach kept", store_history=False)
        assert "Attached 'kept'" in out.stdout, out.stdout + out.stderr
        res = lab.reservations()[-1]
        assert res.name == "kept" and res.slice_names == made["kept"]["slices"] and res.detached
        assert lab.run_on("kept", "import jax\njax.process_index()").values == [0, 1]
        lab.release("kept")
        lab.release("kept2")  # never attached: released by name
    finally:
        for name in ("kept", "kept2"):
            for info in lab.cluster_reservations():
                if info.name == name:
                    lab.release(name)
    assert wait_until(lambda: not live_placement_groups(), 10)
    assert not lab.cluster_reservations()
    assert wait_until(lambda: len(lab.snapshot().idle_slices(V4)) == 3, 10)
