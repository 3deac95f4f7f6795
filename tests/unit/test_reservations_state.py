"""Pure: raytpu reservations and their host order read from raw Ray state."""

from __future__ import annotations

import pytest

from raytpu_lab.reservations.info import head_lock_name, host_order, list_reservations


def _node(node_id: str, slice_name: str, worker: int) -> dict:
    return {"node_id": node_id, "alive": True, "ip": f"10.0.0.{node_id[-1]}", "is_head": False,
            "labels": {"ray.io/tpu-slice-name": slice_name, "ray.io/tpu-worker-id": str(worker),
                       "ray.io/tpu-pod-type": "v4-16", "ray.io/tpu-topology": "2x2x2"},
            "resources_total": {"TPU": 4.0}, "resources_available": {}}


RAW = {
    "nodes": [_node("n1", "s0", 0), _node("n2", "s0", 1), _node("n3", "s1", 0), _node("n4", "s1", 1)],
    "placement_groups": [
        # Ray placed bundle 0 on worker 1 and bundle 1 on worker 0.
        {"placement_group_id": "aa", "name": "raytpu:r1", "state": "CREATED",
         "bundles": [{"index": 0, "node_id": "n2", "resources": {"TPU": 4.0, "CPU": 1.0}},
                     {"index": 1, "node_id": "n1", "resources": {"TPU": 4.0, "CPU": 1.0}}]},
        {"placement_group_id": "bb", "name": head_lock_name("r1", "s0"), "state": "CREATED",
         "bundles": [{"index": 0, "node_id": "n1", "resources": {"TPU-v4-16-head": 1.0}}]},
        {"placement_group_id": "cc", "name": "", "state": "CREATED",
         "bundles": [{"index": 0, "node_id": "n3", "resources": {"TPU": 4.0}}]},
        {"placement_group_id": "dd", "name": "raytpu:r2", "state": "PENDING",
         "bundles": [{"index": 0, "node_id": None, "resources": {"TPU": 4.0}}]},
    ],
}


def test_lists_each_reservation_with_its_slices_head_locks_and_lifetime() -> None:
    r1, r2 = list_reservations(RAW, {"aa": {"is_detached": True, "creator_job_id": "03000000"}})
    assert (r1.name, r1.slice_names, r1.pod_type, r1.topology, r1.num_hosts, r1.chips) == (
        "r1", ["s0"], "v4-16", "2x2x2", 2, 8)
    assert r1.head_locks == {"s0": "bb"} and r1.detached is True and r1.creator_job_id == "03000000"
    assert (r2.name, r2.state, r2.slice_names, r2.detached) == ("r2", "PENDING", [], None)


def test_host_order_is_worker_id_order_not_bundle_order() -> None:
    slots = host_order(RAW, "aa", ["s0"])
    assert [(s.bundle_index, s.worker_id, s.node_id) for s in slots] == [(1, 0, "n1"), (0, 1, "n2")]


def test_host_order_refuses_unplaced_bundles() -> None:
    with pytest.raises(ValueError, match="not placed"):
        host_order(RAW, "dd", [])
    with pytest.raises(ValueError, match="not in the cluster state"):
        host_order(RAW, "zz", [])
