"""Ray 2.60's slice-reservation traps, reproduced with bare Ray, each next to our reserve avoiding it.

(a) ``get_num_ready_tpu_slices`` counts a slice whose chips are all held: Ray omits an exhausted
    resource from a node's available resources and the function reads the missing key as "all free".
(b) ``slice_placement_group``'s head lock is made without a lifetime: it dies with its driver even
    when the reservation is detached, leaving the slice's head free while its chips are held.
(c) (a slice missing a host) is in ``test_zz_host_loss.py``: it needs a host killed, which is done
    last.

Uses the session cluster's three v4 2x2x2 slices (two hosts, 4 chips each, pod type v4-16).
"""

from __future__ import annotations

import pytest
import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.tpu import get_num_ready_tpu_slices

from raytpu_lab.cluster import emulator
from raytpu_lab.errors import NoSliceAvailableError
from raytpu_lab.lab import Lab
from raytpu_lab.tpu.labels import LABEL_SLICE

from . import _driver
from .conftest import live_placement_groups, wait_until

V4 = "v4-16"


def test_trap_a_ray_counts_a_fully_held_slice_as_ready_our_snapshot_does_not(lab: Lab) -> None:
    target = "tpu-v4-2x2x2-1"
    held = placement_group([{"TPU": 4}] * 2, strategy="STRICT_SPREAD",
                           bundle_label_selector=[{LABEL_SLICE: target}] * 2)
    try:
        ray.get(held.ready(), timeout=20)
        assert wait_until(lambda: lab.snapshot().slice(target).chips_free == 0)

        # Bare Ray: every chip of `target` is held, yet it is counted as ready and idle.
        assert get_num_ready_tpu_slices("2x2x2", "TPU-V4") == 3
        # Ours: missing availability is zero free chips.
        snap = lab.snapshot()
        assert snap.slice(target).state == "reserved"
        assert sorted(s.name for s in snap.idle_slices(V4)) == ["tpu-v4-2x2x2-0", "tpu-v4-2x2x2-2"]

        res = lab.reserve("2x2x2", "v4", slices=2, name="trap-a", timeout_s=20)
        assert target not in res.slice_names
        lab.release("trap-a")
        with pytest.raises(NoSliceAvailableError) as info:
            lab.reserve("2x2x2", "v4", slices=3, name="trap-a3", timeout_s=2)
        assert info.value.reasons[target].startswith("held by placement group")
        assert info.value.slices_idle == 2
    finally:
        remove_placement_group(held)
    assert wait_until(lambda: not live_placement_groups())
    assert wait_until(lambda: len(lab.snapshot().idle_slices(V4)) == 3)


@pytest.mark.slow
def test_trap_b_rays_head_lock_dies_with_its_driver_ours_is_detached_too(
        lab: Lab, cluster: emulator.EmulatedCluster) -> None:
    bare_proc = _driver.start("bare-detached", cluster.address, "bare-b", "--timeout", "20")
    bare = _driver.result(bare_proc)
    ours_proc = _driver.start("reserve", cluster.address, "det-b", "--detached", "--timeout", "20")
    ours = _driver.result(ours_proc)
    try:
        assert bare["ok"] and ours["ok"], (bare, ours)
        assert bare_proc.wait(timeout=30) == 0 and ours_proc.wait(timeout=30) == 0  # drivers exited

        def state(pg_id: str) -> str:
            return str(ray.util.placement_group_table().get(pg_id, {}).get("state", "REMOVED"))

        # Bare Ray: the detached worker group survives its driver, its head lock does not.
        assert wait_until(lambda: all(state(h) == "REMOVED" for h in bare["head_pgs"]), 10)
        assert state(bare["placement_group"]) == "CREATED"
        bare_slice = next(s for s in lab.snapshot().slices_of(V4)
                          if any(o.startswith("placement group") for o in s.owners))
        assert not bare_slice.head_locked, "Ray's head lock outlived its driver"

        # Ours: the chips and the head lock both survive the driver.
        assert state(ours["placement_group"]) == "CREATED"
        assert all(state(h) == "CREATED" for h in ours["head_locks"])
        (own_slice,) = ours["slices"]
        snap = lab.snapshot()
        assert snap.slice(own_slice).owners == ["det-b"] and snap.slice(own_slice).head_locked
        assert own_slice != bare_slice.name
    finally:
        for proc in (bare_proc, ours_proc):
            proc.kill()
        for name in ("bare-b", "raytpu:det-b", *(f"raytpu:det-b:head:{s}" for s in ours.get("slices", []))):
            try:
                remove_placement_group(ray.util.get_placement_group(name))
            except ValueError:  # never made
                pass
    assert wait_until(lambda: not live_placement_groups())
    assert wait_until(lambda: len(lab.snapshot().idle_slices(V4)) == 3)
