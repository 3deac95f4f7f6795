"""Our copy of Ray's TPU tables agrees with the installed Ray on every entry.

Imports Ray's private ``ray._private.accelerators.tpu`` on purpose: a Ray upgrade that changes
the tables or rules fails here, and the fix goes into ``raytpu_lab/tpu/topology.py``.
"""

from __future__ import annotations

import pytest

from raytpu_lab.tpu import GENERATIONS, slice_shape

ray_tpu = pytest.importorskip("ray._private.accelerators.tpu")

ALL_ENTRIES = sorted(
    (version, topology)
    for version, topologies in ray_tpu.VALID_TPU_TOPOLOGY.items()
    for topology in topologies
)


def test_same_generations() -> None:
    assert set(GENERATIONS) == set(ray_tpu.VALID_TPU_TYPES) == set(ray_tpu.VALID_TPU_TOPOLOGY)


@pytest.mark.parametrize("version", sorted(GENERATIONS))
def test_same_valid_topologies(version: str) -> None:
    assert set(GENERATIONS[version].valid_topologies) == set(ray_tpu.VALID_TPU_TOPOLOGY[version])


@pytest.mark.parametrize("version", sorted(GENERATIONS))
def test_same_cores_per_chip(version: str) -> None:
    assert GENERATIONS[version].cores_per_chip == ray_tpu.get_tpu_cores_per_chip(version)


def test_every_entry_agrees() -> None:
    """Chips per host, pod type, accelerator type and the GKE type, for all entries at once."""
    mismatches = []
    for version, topology in ALL_ENTRIES:
        s = slice_shape(version, topology)
        ours = (s.chips_per_host, s.pod_type, s.accelerator_type,
                ray_tpu.normalize_tpu_accelerator_type(s.gke_accelerator_type))
        accelerator_type = f"TPU-{version.upper()}"
        rays = (
            ray_tpu.get_chips_per_host(topology, version),
            ray_tpu.infer_tpu_pod_type_from_topology(topology, accelerator_type),
            accelerator_type,
            ray_tpu.infer_tpu_pod_type_from_topology(topology, accelerator_type),
        )
        if ours != rays:
            mismatches.append((version, topology, ours, rays))
        assert ray_tpu.TPUAcceleratorManager.is_valid_tpu_accelerator_topology(version, topology)
        assert ray_tpu.TPUAcceleratorManager.is_valid_tpu_accelerator_type(s.gke_accelerator_type)
    assert not mismatches
    assert len(ALL_ENTRIES) > 100  # the generated 3-D tables are included


@pytest.mark.parametrize(("version", "topology"), ALL_ENTRIES)
def test_total_chips_from_pod_type(version: str, topology: str) -> None:
    s = slice_shape(version, topology)
    assert ray_tpu.get_total_chips_from_accelerator_type(s.pod_type) == s.num_chips


@pytest.mark.parametrize(
    ("topology", "worker_dims"),
    [*ray_tpu._VALID_TOPOLOGY_WORKER_DIMS_2D.items(), *ray_tpu._VALID_TOPOLOGY_WORKER_DIMS_3D.items()],
)
def test_host_grid_matches_rays_worker_dims(topology: str, worker_dims: tuple[int, ...]) -> None:
    """Ray's subslice worker grid assumes 4-chip hosts; ours agrees with 4-chip hosts.

    Ray's comments call the tuples (y, x) / (z, y, x), but the values equal GKE's host bounds in
    x, y, z order (``TPU_HOST_BOUNDS``), which is how :attr:`SliceShape.host_grid` is ordered.
    """
    version = "v6e" if topology.count("x") == 1 else "v5p"
    assert slice_shape(version, topology, chips_per_host=4).host_grid == tuple(worker_dims)
