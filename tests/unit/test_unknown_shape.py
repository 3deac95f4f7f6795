"""Shapes outside the topology tables: host counts from labels and resources, a drawable grid,
and reservations that never take such a slice."""

from __future__ import annotations

import pytest

from raytpu_lab.errors import InvalidTopologyError
from raytpu_lab.tpu import SliceShape, unknown_shape
from raytpu_lab.tpu.unknown import MAX_UNKNOWN_HOSTS


@pytest.mark.parametrize(
    ("pod", "accel", "topology", "cph", "seen", "expected", "version", "hosts", "notes"),
    [
        # Ray's rule: TensorCores in the pod type over cores per host, rounded up.
        ("v2-8", "TPU-V2", "2x2", 4, 1, None, "v2", 1, []),
        ("v3-8", None, "2x2", 4, 1, None, "v3", 1, []),
        ("v2-8", "TPU-V2", "2x4", 4, 1, None, "v2", 1,
         ["labels inconsistent: pod type v2-8 is 4 chip(s), topology 2x4 is 8"]),
        ("v6e-16", "TPU-V6E", "banana", 4, 4, None, "v6e", 4, []),
        ("v6e-12", None, None, 8, 1, None, "v6e", 2, []),  # 12 chips on 8-chip hosts: 2
        # Unknown generation: chips from the topology.
        ("v9z-16", None, "2x4", 4, 2, None, "v9z", 2, []),
        ("v9z-16", None, "2x4", 4, 1, None, "v9z", 2, []),
        # Only the accelerator type: the version from it, hosts from the topology.
        (None, "TPU-V2", "2x2", 4, 1, None, "v2", 1, []),
        # Nothing to derive from: the hosts seen, capped.
        (None, None, None, 4, 3, None, "unknown", 3,
         ["host count unknown: drawn as the 3 host(s) seen"]),
        (None, None, "x", 4, 10**6, None, "unknown", MAX_UNKNOWN_HOSTS,
         [f"host count unknown: drawn as the {MAX_UNKNOWN_HOSTS} host(s) seen"]),
        ("v9z-16", None, None, 0, 2, None, "v9z", 2,  # no TPU resource: nothing to divide by
         ["host count unknown: drawn as the 2 host(s) seen"]),
        # The caller's count (the emulator's) wins.
        ("v9z-16", None, "2x4", 4, 2, 3, "v9z", 3, []),
    ],
)
def test_unknown_shape_host_count(pod: str | None, accel: str | None, topology: str | None,
                                  cph: int, seen: int, expected: int | None, version: str,
                                  hosts: int, notes: list[str]) -> None:
    shape, got = unknown_shape(pod, accel, topology, chips_per_host=cph, hosts_seen=seen,
                               num_hosts=expected)
    assert (shape.version, shape.num_hosts, shape.chips_per_host, got) == (
        version, hosts, cph, notes)
    assert shape.head_resource == (f"TPU-{pod}-head" if pod else "")


@pytest.mark.parametrize(
    ("hosts", "cph", "grid", "block"),
    [(1, 4, (1, 1), (2, 2)), (2, 4, (2, 1), (2, 2)), (3, 4, (2, 2), (2, 2)),
     (5, 8, (3, 2), (2, 4)), (16, 1, (4, 4), (1, 1)), (2, 2, (2, 1), (1, 2)),
     (1, 6, (1, 1), (2, 3)), (1, 3, (1, 1), (1, 3)), (1, 0, (1, 1), (1, 1))],
)
def test_unknown_shape_is_a_grid_of_whole_host_blocks(hosts: int, cph: int,
                                                      grid: tuple[int, int],
                                                      block: tuple[int, int]) -> None:
    shape, _ = unknown_shape("v9z-16", None, None, chips_per_host=cph, hosts_seen=hosts)
    assert (shape.host_grid, shape.chips_per_host_bounds) == (grid, block)
    assert shape.wraparound == (False, False) and shape.num_chips == hosts * cph
    coords = [c for w in range(hosts) for c in shape.chip_coords(w)]
    assert len(set(coords)) == len(coords) == hosts * cph
    assert all(0 <= x < shape.dims[0] and 0 <= y < shape.dims[1] for x, y in coords)
    with pytest.raises(InvalidTopologyError, match="not in slice of unknown shape"):
        shape.host_coords(hosts)


def test_reservations_never_take_an_unknown_shape_slice() -> None:
    from raytpu_lab.reservations.slices import diagnose
    from raytpu_lab.state import build_snapshot

    # An idle host labelled v6e-16 whose topology no table has: a v6e 4x4 request must not get it.
    labels = {"ray.io/tpu-slice-name": "odd", "ray.io/tpu-worker-id": "0",
              "ray.io/tpu-pod-type": "v6e-16", "ray.io/tpu-topology": "16",
              "ray.io/accelerator-type": "TPU-V6E"}
    total = {"TPU": 4.0, "TPU-v6e-16-head": 1.0, "odd": 1.0}
    node = {"node_id": "o" * 56, "alive": True, "ip": "10.0.0.5", "is_head": False,
            "labels": labels, "resources_total": total, "resources_available": dict(total)}
    snap = build_snapshot({"nodes": [node], "placement_groups": []})
    assert [s.name for s in snap.slices_of("v6e-16")] == ["odd"]
    assert snap.idle_slices("v6e-16") == [] and snap.slice("odd").health == "degraded"
    err = diagnose(snap, SliceShape("v6e", "4x4"), 1, timeout_s=0.0, impossible=True)
    assert err.reasons["odd"].startswith("degraded: unknown TPU shape v6e-16 (16): drawn from")
    assert "0 intact slice(s)" in str(err)
