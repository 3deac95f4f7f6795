"""Each emulated host's labels and resources are what Ray derives from the GKE TPU environment."""

from __future__ import annotations

import pytest
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


@pytest.mark.slow
def test_every_generation_shows_what_a_real_slice_shows(lab: Lab, cluster: emulator.EmulatedCluster) -> None:
    """Per slice of each generation (its first slice): one task per host holding the host's chips
    sees the slice's devices with process index = worker id; each host has its own address."""
    import os

    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(max_calls=1)
    def probe() -> tuple[int, int, int, str]:
        import jax

        return (jax.device_count(), jax.local_device_count(), jax.process_index(),
                os.environ["TPU_WORKER_ID"])

    by_slice: dict[str, list[emulator.EmulatedHost]] = {}
    for host in cluster.hosts:
        by_slice.setdefault(host.slice_name, []).append(host)
    firsts = {parse_spec(h[0].spec).version: name for name, h in by_slice.items()
              if name.endswith("-0")}
    nodes = {n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert len({h.ip for h in cluster.hosts}) == len(cluster.hosts)  # one address per host
    refs = {}
    for name in firsts.values():
        for host in by_slice[name]:
            shape = parse_spec(host.spec)
            refs[(name, host.worker_id)] = probe.options(
                resources={"TPU": shape.chips_per_host},
                scheduling_strategy=NodeAffinitySchedulingStrategy(nodes[host.ip], soft=False),
            ).remote()
    got = dict(zip(refs, ray.get(list(refs.values()), timeout=600), strict=True))
    for (name, worker_id), (count, local, index, env_worker) in got.items():
        shape = parse_spec(by_slice[name][0].spec)
        assert (count, local) == (shape.num_devices, shape.devices_per_host), (name, worker_id)
        assert index == worker_id == int(env_worker), (name, worker_id)


@pytest.mark.slow
def test_the_test_clusters_jobs_api_accepts_ray_job_submit(cluster: emulator.EmulatedCluster) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run(
        [str(Path(sys.executable).with_name("ray")), "job", "submit", "--address",
         cluster.dashboard_url, "--", "python", "-c", "import ray; print('job-ok', ray.__version__)"],
        env={**os.environ, **emulator.AUTH_ENV}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "job-ok" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
