"""A 2-slice JAX run with ``max_failures=1`` and a spare slice survives the loss of a host.

Its own emulated cluster (3 x v4 2x2x1: one host per slice), so the shared one keeps all its
hosts. One host of the run is killed (``SIGKILL`` of its node's process group, as a TPU VM
vanishes) while the run reports: Ray Train restarts the worker group on the two intact slices,
its JAX backend gives the new workers fresh ``MEGASCALE_*`` values, the run completes, and its
result and dashboard list the restart. The live map shows the lost slice degraded within 3 s.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest
import ray

from raytpu_lab.cluster import emulator
from raytpu_lab.lab import Lab
from raytpu_lab.widgets.run_dashboard import RunDashboard

from .conftest import live_actors, live_placement_groups, wait_until

pytestmark = pytest.mark.slow

NAME = "rt-restart"
MAP_DEGRADED_S = 3.0


@pytest.fixture(scope="module")
def small() -> Iterator[emulator.EmulatedCluster]:
    if ray.is_initialized():
        ray.shutdown()  # one driver talks to one cluster at a time
    cluster = emulator.up([("v4:2x2x1", 3)], name=NAME, timeout_s=600)
    try:
        yield cluster
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.down()


def steady(config):
    import time

    import ray.train

    for step in range(config["steps"]):
        time.sleep(config["step_s"])
        ray.train.report({"step": step, "loss": 1.0 / (step + 1)})


def test_a_lost_host_restarts_the_run_on_intact_slices(small: emulator.EmulatedCluster) -> None:
    lab = Lab()
    lab.connect(small.address)
    assert wait_until(lambda: sum(n["Alive"] for n in ray.nodes()) == 4, 90)
    live_map = lab.map(interval_s=0.25)
    dash = RunDashboard("restart", live=False)
    handle = lab.start_jax(steady, "2x2x1", "v4", slices=2, name="restart",
                           config={"steps": 24, "step_s": 0.25}, max_failures=1,
                           listener=dash, wait_s=60)
    try:
        assert wait_until(lambda: len(handle.result.rank0()) >= 3, 120), handle.result
        # The run's stream (two queue actors) lives on the driver's node, never on a TPU host
        # that may be lost: a soft pin once put them on the victim and the restart went unseen.
        assert _queue_nodes() == {ray.get_runtime_context().get_node_id()}, _queue_nodes()
        first = handle.result.attempts()[0]
        assert len(first["slices"]) == 2, first
        victim_slice = first["slices"][1]
        victim = next(h for h in small.hosts if h.slice_name == victim_slice)
        killed, killed_at_s = time.monotonic(), handle.elapsed_s
        os.killpg(victim.pid, signal.SIGKILL)

        def degraded() -> bool:
            snap = live_map.snapshot
            return snap is not None and snap.slice(victim_slice).health == "degraded"

        assert wait_until(degraded, timeout_s=30)
        degraded_s = time.monotonic() - killed
        result = handle.wait(timeout_s=240)
    finally:
        if not handle.done:
            handle.stop()
        live_map.close()
    print(f"killed {victim_slice} at {killed_at_s:.1f} s; the map showed it degraded "
          f"{degraded_s:.2f} s later")
    attempts = result.attempts()
    for a in attempts:
        print(f"attempt {a['attempt']}: {a['started_s']}-{a['ended_s']} s on {a['slices']} "
              f"{a['outcome']}; lost {a['lost_s']} s; {a['cause']}; megascale {a['megascale']}")
    assert result.error is None and not result.stopped
    assert len(result.restarts) == 1 and [a["outcome"] for a in attempts] == [
        "restarted", "finished"]
    assert attempts[0]["failed_slices"] == [victim_slice], attempts[0]
    assert victim.ip in attempts[0]["failed_hosts"], attempts[0]
    intact = sorted(s.name for s in small_slices(lab) if s.name != victim_slice)
    assert attempts[1]["slices"] == intact, attempts[1]  # the spare and the survivor
    assert attempts[0]["lost_s"] is not None and attempts[1]["started_s"] > attempts[0]["started_s"]
    for a in attempts:
        ms = sorted(a["megascale"], key=lambda m: m["rank"])
        assert len(ms) == 2 and {m["num_slices"] for m in ms} == {"2"}
        # Ray gives slice ids in TPU_NAME order, one per slice; rank 0's IP coordinates.
        assert {m["slice"]: m["slice_id"] for m in ms} == {
            name: str(i) for i, name in enumerate(sorted(a["slices"]))}, ms
        assert {m["coordinator"] for m in ms} == {ms[0]["host"]}, ms
    assert attempts[0]["megascale"] != attempts[1]["megascale"]
    assert result.steps == 24 and result.slice_names == intact
    assert dash.view.restart_text().startswith("attempt 0 -> 1"), dash.view.restart_text()
    assert victim_slice in dash.view.restarts_html() and "restarted" in dash.view.restarts_html()
    assert "attempt 2" in dash.view.text()
    assert degraded_s < MAP_DEGRADED_S, f"{degraded_s:.2f} s"
    assert wait_until(lambda: not live_placement_groups(), 15), live_placement_groups()
    assert wait_until(lambda: not live_actors(), 15), live_actors()


def _queue_nodes() -> set[str]:
    from ray.util.state import list_actors

    address = ray.get_runtime_context().gcs_address
    return {a.node_id for a in list_actors(address=address, filters=[
        ("state", "=", "ALIVE"), ("class_name", "=", "_QueueActor")])}


def small_slices(lab: Lab) -> list:
    return list(lab.snapshot().slices)
