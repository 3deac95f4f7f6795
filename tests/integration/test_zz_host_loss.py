"""A host dies under a live map (runs last: it breaks the session cluster's v4 slice for good)."""

from __future__ import annotations

import os
import signal
import time

import pytest
import ray

from raytpu_lab.cluster import emulator
from raytpu_lab.errors import NoSliceAvailableError
from raytpu_lab.lab import Lab

from .conftest import live_placement_groups, wait_until


def test_a_slice_that_loses_a_host_is_degraded_on_the_map_and_not_handed_out(
        lab: Lab, cluster: emulator.EmulatedCluster) -> None:
    live_map = lab.map(interval_s=0.3)
    victim = next(h for h in cluster.hosts if h.slice_name == "tpu-v4-2x2x2-0" and h.worker_id == 1)
    os.killpg(victim.pid, signal.SIGKILL)

    def degraded() -> bool:
        snap = live_map.snapshot
        return snap is not None and snap.slice("tpu-v4-2x2x2-0").health == "degraded"

    assert wait_until(degraded, timeout_s=60), "the map never showed the slice degraded"
    broken = live_map.snapshot.slice("tpu-v4-2x2x2-0")
    assert any("worker 1" in reason for reason in broken.reasons), broken.reasons
    assert broken.hosts[1].state in ("dead", "missing")
    assert live_map.snapshot.slice("tpu-v6e-4x4-0").health == "intact"

    # Three v4 slices, one degraded: asking for all three fails and names the broken one; the
    # two intact ones are still handed out, never the degraded one.
    with pytest.raises(NoSliceAvailableError, match="degraded: worker 1"):
        lab.reserve("2x2x2", "v4", slices=3, timeout_s=2)
    assert not live_placement_groups()
    held = lab.reserve("2x2x2", "v4", slices=2, timeout_s=30)
    assert "tpu-v4-2x2x2-0" not in held.slice_names
    lab.release(held.name)
    assert not live_placement_groups()
    live_map.close()


@pytest.mark.slow
def test_trap_c_bare_slice_placement_group_wins_a_degraded_head_ours_refuses(
        lab: Lab, cluster: emulator.EmulatedCluster) -> None:
    """Ray 2.60 trap (c): a slice missing a host still has its head won by bare
    ``slice_placement_group``, whose worker group then never becomes ready."""
    from ray.util.tpu import slice_placement_group

    broken = "tpu-v4-2x2x2-0"
    victim = next(h for h in cluster.hosts if h.slice_name == broken and h.worker_id == 1)
    if lab.snapshot().slice(broken).health == "intact":  # run alone (-k): break the slice here
        os.killpg(victim.pid, signal.SIGKILL)
    assert wait_until(lambda: lab.snapshot().slice(broken).health == "degraded", timeout_s=60)
    # Hold the two intact v4 slices, so the degraded one is the only slice whose head is free.
    intact = lab.reserve("2x2x2", "v4", slices=2, name="intact-c", timeout_s=30)
    assert broken not in intact.slice_names
    try:
        bare = slice_placement_group("2x2x2", "v4", head_reservation_timeout_s=10)
        try:
            (head,) = bare.head_placement_groups
            head_node = ray.util.placement_group_table(head)["bundles_to_node_id"][0]
            assert head_node == lab.snapshot().slice(broken).hosts[0].node_id  # won the broken head
            ready, _ = ray.wait([bare.placement_group.ready()], timeout=3)
            assert not ready, "the worker group of a slice missing a host became ready"
        finally:
            bare.shutdown()

        start = time.monotonic()
        with pytest.raises(NoSliceAvailableError) as info:
            lab.reserve("2x2x2", "v4", name="c", timeout_s=2)
        assert time.monotonic() - start < 10
        assert info.value.reasons[broken].startswith("degraded: worker 1")
        assert "held by intact-c" in info.value.reasons.values()
    finally:
        lab.release("intact-c")
    assert wait_until(lambda: not live_placement_groups())
