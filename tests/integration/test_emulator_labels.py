"""Each emulated host's labels and resources are what Ray derives from the GKE TPU environment."""

from __future__ import annotations

import ray

from raytpu_lab.cluster import emulator
from raytpu_lab.lab import Lab
from raytpu_lab.tpu.topology import parse_spec

from .conftest import SPECS


def test_every_host_joined_with_ray_derived_tpu_labels(lab: Lab, cluster: emulator.EmulatedCluster) -> None:
    nodes = {n["Labels"].get("ray.io/tpu-slice-name", "") + "/" + n["Labels"].get("ray.io/tpu-worker-id", ""): n
             for n in ray.nodes() if n["Alive"] and "TPU" in n["Resources"]}
    assert len(nodes) == len(cluster.hosts) == 18
    for host in cluster.hosts:
        shape = parse_spec(host.spec)
        node = nodes[f"{host.slice_name}/{host.worker_id}"]
        labels, resources = node["Labels"], node["Resources"]
        assert labels["ray.io/tpu-topology"] == shape.topology
        assert labels["ray.io/tpu-pod-type"] == shape.pod_type
        assert labels["ray.io/accelerator-type"] == shape.accelerator_type
        assert resources["TPU"] == shape.chips_per_host
        assert resources[host.slice_name] == 1
        assert resources[f"accelerator_type:{shape.accelerator_type}"] == 1
        has_head = shape.head_resource in resources
        assert has_head == (host.worker_id == 0), (host, sorted(resources))


def test_every_generation_is_in_the_cluster(cluster: emulator.EmulatedCluster) -> None:
    versions = {parse_spec(spec).version for spec, _ in SPECS}
    assert versions == {"v6e", "v4", "v5litepod", "v5p", "v7x"}


def test_snapshot_sees_intact_idle_slices(lab: Lab) -> None:
    snap = lab.snapshot()
    assert [s.name for s in snap.slices_of("v6e-16")] == ["tpu-v6e-4x4-0", "tpu-v6e-4x4-1"]
    assert all(s.health == "intact" for s in snap.slices), [(s.name, s.reasons) for s in snap.slices]
    assert snap.slice("tpu-v4-2x2x2-0").hosts_alive == 2
    assert snap.slice("tpu-v7x-2x2x1-0").pod_type == "v7x-8"
    assert [n.is_head for n in snap.other_nodes] == [True]
