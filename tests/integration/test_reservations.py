"""Reservations through ray.util.tpu.slice_placement_group on the emulated cluster."""

from __future__ import annotations

import time

import pytest
import ray

from raytpu_lab.errors import InvalidTopologyError, NoSliceAvailableError, ReservationError
from raytpu_lab.lab import Lab

from .conftest import live_placement_groups, wait_until


def test_two_reservations_take_both_slices_and_a_third_fails_cleanly(lab: Lab) -> None:
    a = lab.reserve("4x4", "v6e", name="a")
    b = lab.reserve("4x4", "v6e", name="b")
    assert sorted(a.slice_names + b.slice_names) == ["tpu-v6e-4x4-0", "tpu-v6e-4x4-1"]

    # Every bundle of each reservation sits on a distinct host of its own slice.
    node_slice = {n["NodeID"]: n["Labels"].get("ray.io/tpu-slice-name") for n in ray.nodes()}
    for res in (a, b):
        table = ray.util.placement_group_table(res.placement_group)
        nodes = list(table["bundles_to_node_id"].values())
        assert len(set(nodes)) == 4
        assert {node_slice[n] for n in nodes} == set(res.slice_names)
        assert all(bundle["TPU"] == 4 for bundle in table["bundles"].values())

    assert wait_until(lambda: {s.state for s in lab.snapshot().slices_of("v6e-16")} == {"reserved"})
    before = len(live_placement_groups())
    start = time.monotonic()
    with pytest.raises(NoSliceAvailableError) as info:
        lab.reserve("4x4", "v6e", name="c", timeout_s=3)
    assert time.monotonic() - start < 15
    err = info.value
    assert err.slices_idle == 0
    assert err.reasons == {"tpu-v6e-4x4-0": f"held by {'a' if 'tpu-v6e-4x4-0' in a.slice_names else 'b'}",
                           "tpu-v6e-4x4-1": f"held by {'b' if 'tpu-v6e-4x4-0' in a.slice_names else 'a'}"}
    assert "tpu-v6e-4x4-0" in str(err) and "What to do" in str(err)
    assert len(live_placement_groups()) == before, "the failed attempt left placement groups"

    lab.release("a")
    lab.release("b")
    assert not [pg for pg in live_placement_groups() if pg["name"].startswith("raytpu:")]
    assert wait_until(lambda: len(lab.snapshot().idle_slices("v6e-16")) == 2)


def test_more_slices_than_the_cluster_has_fail_at_once(lab: Lab) -> None:
    start = time.monotonic()
    with pytest.raises(NoSliceAvailableError, match="cluster has 2 intact"):
        lab.reserve("4x4", "v6e", slices=3, timeout_s=30)
    assert time.monotonic() - start < 5
    assert not live_placement_groups()


def test_multi_slice_reservation_holds_both_slices(lab: Lab) -> None:
    res = lab.reserve("4x4", "v6e", slices=2, name="both")
    assert sorted(res.slice_names) == ["tpu-v6e-4x4-0", "tpu-v6e-4x4-1"]
    assert res.num_hosts == 8 and res.num_chips == 32
    lab.release("both")
    assert not live_placement_groups()


@pytest.mark.parametrize(("topology", "version"), [("4x5", "v6e"), ("4x4", "v4"), ("4x4", "v9")])
def test_invalid_requests_fail_before_ray_is_asked(lab: Lab, topology: str, version: str) -> None:
    with pytest.raises(InvalidTopologyError):
        lab.reserve(topology, version)
    assert not live_placement_groups()


def test_release_unknown_name(lab: Lab) -> None:
    with pytest.raises(ReservationError, match="No reservation named 'nope'"):
        lab.release("nope")
