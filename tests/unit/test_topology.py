"""Tables of (version, topology, expected) for the pure topology core, invalid rows included."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from raytpu_lab.errors import InvalidTopologyError
from raytpu_lab.tpu import (
    GENERATIONS,
    SliceShape,
    ici_links,
    normalize_version,
    parse_spec,
    slice_shape,
    split_pod_type,
    valid_topologies,
)

# A spread of shapes over every generation, reused by the invariant tests below.
SAMPLE_SHAPES = [
    ("v2", "4x4"), ("v3", "32x32"), ("v4", "2x2x1"), ("v4", "2x2x2"), ("v4", "4x4x8"),
    ("v5p", "2x2x4"), ("v5p", "4x8x12"), ("v5litepod", "1x1"), ("v5litepod", "2x4"),
    ("v5litepod", "2x8"), ("v5litepod", "16x16"), ("v6e", "2x2"), ("v6e", "4x4"),
    ("v6e", "8x16"), ("v7x", "2x2x1"), ("v7x", "4x4x4"),
]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("v6e", "v6e"), ("V6E", "v6e"), ("TPU-V6E", "v6e"), (" tpu-v6e ", "v6e"),
        ("v5e", "v5litepod"), ("v5lite", "v5litepod"), ("v5litepod", "v5litepod"),
        ("TPU-V5LITEPOD", "v5litepod"), ("tpu7x", "v7x"), ("v7x", "v7x"), ("TPU-V7X", "v7x"),
        ("v4", "v4"), ("v5p", "v5p"), ("v2", "v2"), ("v3", "v3"),
        ("tpu-v6e-slice", "v6e"), ("tpu-v5-lite-podslice", "v5litepod"),
        ("tpu-v5-lite-device", "v5litepod"), ("tpu-v4-podslice", "v4"),
        ("tpu-v5p-slice", "v5p"),
    ],
)
def test_normalize_version(name: str, expected: str) -> None:
    assert normalize_version(name) == expected


@pytest.mark.parametrize("name", ["v9", "", "v5", "gpu", "v6", "tpu-v9-slice"])
def test_normalize_version_rejects_unknown_and_names_the_known(name: str) -> None:
    with pytest.raises(InvalidTopologyError) as info:
        normalize_version(name)
    assert "v6e" in info.value.why and "v5litepod" in info.value.why


@pytest.mark.parametrize(
    ("version", "accelerator_type", "cores", "devices", "ndims", "gke", "prefix"),
    [
        ("v2", "TPU-V2", 2, 2, 2, None, "v2"),
        ("v3", "TPU-V3", 2, 2, 2, None, "v3"),
        ("v4", "TPU-V4", 2, 1, 3, "tpu-v4-podslice", "v4"),
        ("v5p", "TPU-V5P", 2, 1, 3, "tpu-v5p-slice", "v5p"),
        ("v5litepod", "TPU-V5LITEPOD", 1, 1, 2, "tpu-v5-lite-podslice", "v5litepod"),
        ("v6e", "TPU-V6E", 1, 1, 2, "tpu-v6e-slice", "v6e"),
        ("v7x", "TPU-V7X", 2, 2, 3, "tpu7x", "tpu7x"),
    ],
)
def test_generations(version: str, accelerator_type: str, cores: int, devices: int, ndims: int,
                     gke: str | None, prefix: str) -> None:
    gen = GENERATIONS[version]
    assert (gen.version, gen.accelerator_type, gen.cores_per_chip, gen.devices_per_chip,
            gen.ndims, gen.gke_accelerator, gen.gke_type_prefix) == (
        version, accelerator_type, cores, devices, ndims, gke, prefix)
    assert all(t.count("x") + 1 == ndims for t in gen.valid_topologies)


def test_generation_keys_are_rays_versions() -> None:
    assert list(GENERATIONS) == ["v2", "v3", "v4", "v5p", "v5litepod", "v6e", "v7x"]


@pytest.mark.parametrize(
    ("version", "expected_head"),
    [
        ("v6e", ["1x1", "2x2", "2x4", "2x8", "4x4", "4x8", "8x8", "8x16", "16x16"]),
        ("v2", ["4x4", "4x8", "8x8", "8x16", "16x16"]),
        ("v4", ["2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4"]),
        ("tpu7x", ["2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8"]),
    ],
)
def test_valid_topologies_sorted_by_chips(version: str, expected_head: list[str]) -> None:
    names = valid_topologies(version)
    assert names[: len(expected_head)] == expected_head
    chips = [math.prod(int(d) for d in t.split("x")) for t in names]
    assert chips == sorted(chips)


@pytest.mark.parametrize(
    ("version", "topology", "pod_type", "gke_type", "accelerator_type", "head"),
    [
        ("v6e", "4x4", "v6e-16", "v6e-16", "TPU-V6E", "TPU-v6e-16-head"),
        ("v4", "2x2x2", "v4-16", "v4-16", "TPU-V4", "TPU-v4-16-head"),
        ("v5litepod", "4x4", "v5litepod-16", "v5litepod-16", "TPU-V5LITEPOD",
         "TPU-v5litepod-16-head"),
        ("v5e", "2x2", "v5litepod-4", "v5litepod-4", "TPU-V5LITEPOD", "TPU-v5litepod-4-head"),
        ("v5p", "2x2x4", "v5p-32", "v5p-32", "TPU-V5P", "TPU-v5p-32-head"),
        ("v7x", "2x2x1", "v7x-8", "tpu7x-8", "TPU-V7X", "TPU-v7x-8-head"),
        ("tpu7x", "4x4x4", "v7x-128", "tpu7x-128", "TPU-V7X", "TPU-v7x-128-head"),
        ("v2", "4x4", "v2-32", "v2-32", "TPU-V2", "TPU-v2-32-head"),
        ("v3", "32x32", "v3-2048", "v3-2048", "TPU-V3", "TPU-v3-2048-head"),
        ("v6e", "16x16", "v6e-256", "v6e-256", "TPU-V6E", "TPU-v6e-256-head"),
    ],
)
def test_names(version: str, topology: str, pod_type: str, gke_type: str,
               accelerator_type: str, head: str) -> None:
    s = slice_shape(version, topology)
    assert (s.pod_type, s.gke_accelerator_type, s.accelerator_type, s.head_resource) == (
        pod_type, gke_type, accelerator_type, head)


@pytest.mark.parametrize(
    ("version", "topology", "chips_per_host", "expected"),
    [
        # (num_chips, chips_per_host, num_hosts, host_grid, chips_per_host_bounds)
        ("v6e", "1x1", None, (1, 1, 1, (1, 1), (1, 1))),
        ("v6e", "2x2", None, (4, 4, 1, (1, 1), (2, 2))),
        ("v6e", "2x4", None, (8, 8, 1, (1, 1), (2, 4))),
        ("v6e", "2x4", 4, (8, 4, 2, (1, 2), (2, 2))),
        ("v6e", "4x4", None, (16, 4, 4, (2, 2), (2, 2))),
        ("v6e", "16x16", None, (256, 4, 64, (8, 8), (2, 2))),
        ("v6e", "4x4", 2, (16, 2, 8, (4, 2), (1, 2))),
        ("v5litepod", "2x4", None, (8, 8, 1, (1, 1), (2, 4))),
        ("v5litepod", "2x8", None, (16, 4, 4, (1, 4), (2, 2))),
        ("v5e", "2x4", 8, (8, 8, 1, (1, 1), (2, 4))),
        ("v4", "2x2x1", None, (4, 4, 1, (1, 1, 1), (2, 2, 1))),
        ("v4", "2x2x2", None, (8, 4, 2, (1, 1, 2), (2, 2, 1))),
        ("v4", "4x4x8", None, (128, 4, 32, (2, 2, 8), (2, 2, 1))),
        ("v5p", "2x2x4", None, (16, 4, 4, (1, 1, 4), (2, 2, 1))),
        ("v7x", "2x2x1", None, (4, 4, 1, (1, 1, 1), (2, 2, 1))),
        ("v2", "4x4", None, (16, 4, 4, (2, 2), (2, 2))),
    ],
)
def test_hosts(version: str, topology: str, chips_per_host: int | None,
               expected: tuple[int, int, int, tuple[int, ...], tuple[int, ...]]) -> None:
    s = slice_shape(version, topology, chips_per_host)
    assert (s.num_chips, s.chips_per_host, s.num_hosts, s.host_grid,
            s.chips_per_host_bounds) == expected
    assert s.num_hosts == max(1, s.num_chips // s.chips_per_host)


@pytest.mark.parametrize(
    ("version", "topology", "host_bounds", "chip_bounds", "wrap"),
    [
        ("v6e", "4x4", "2,2,1", "2,2,1", "false,false,false"),
        ("v6e", "2x4", "1,1,1", "2,4,1", "false,false,false"),
        ("v6e", "1x1", "1,1,1", "1,1,1", "false,false,false"),
        ("v6e", "16x16", "8,8,1", "2,2,1", "true,true,false"),
        ("v6e", "8x16", "4,8,1", "2,2,1", "false,true,false"),
        ("v4", "2x2x2", "1,1,2", "2,2,1", "false,false,false"),
        # Recorded from a real v4-256 TPU VM: HOST_BOUNDS '2,2,8', CHIPS_PER_HOST_BOUNDS '2,2,1',
        # TPU_TOPOLOGY_WRAP 'true,true,true'.
        ("v4", "4x4x8", "2,2,8", "2,2,1", "true,true,true"),
        ("v5p", "4x4x4", "2,2,4", "2,2,1", "true,true,true"),
        ("v7x", "2x4x4", "1,2,4", "2,2,1", "false,false,false"),
    ],
)
def test_bounds_env(version: str, topology: str, host_bounds: str, chip_bounds: str,
                    wrap: str) -> None:
    s = slice_shape(version, topology)
    assert (s.host_bounds_env, s.chips_per_host_bounds_env, s.topology_wrap_env) == (
        host_bounds, chip_bounds, wrap)


@pytest.mark.parametrize(
    ("version", "topology", "worker_id", "host", "chips"),
    [
        ("v6e", "4x4", 0, (0, 0), [(0, 0), (1, 0), (0, 1), (1, 1)]),
        ("v6e", "4x4", 1, (1, 0), [(2, 0), (3, 0), (2, 1), (3, 1)]),
        ("v6e", "4x4", 2, (0, 1), [(0, 2), (1, 2), (0, 3), (1, 3)]),
        ("v6e", "2x4", 0, (0, 0), [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2), (0, 3),
                                   (1, 3)]),
        ("v4", "2x2x2", 1, (0, 0, 1), [(0, 0, 1), (1, 0, 1), (0, 1, 1), (1, 1, 1)]),
        ("v5p", "4x4x4", 5, (1, 0, 1), [(2, 0, 1), (3, 0, 1), (2, 1, 1), (3, 1, 1)]),
    ],
)
def test_host_and_chip_coords(version: str, topology: str, worker_id: int,
                              host: tuple[int, ...], chips: list[tuple[int, ...]]) -> None:
    s = slice_shape(version, topology)
    assert s.host_coords(worker_id) == host
    assert s.chip_coords(worker_id) == chips


@pytest.mark.parametrize(
    ("version", "topology", "chips_per_host"),
    [*((v, t, None) for v, t in SAMPLE_SHAPES), ("v6e", "2x4", 4), ("v6e", "4x4", 2),
     ("v6e", "4x4", 1), ("v4", "2x2x4", 2)],
)
def test_chip_coords_cover_the_slice_exactly_once(version: str, topology: str,
                                                  chips_per_host: int | None) -> None:
    s = slice_shape(version, topology, chips_per_host)
    seen = Counter(c for w in range(s.num_hosts) for c in s.chip_coords(w))
    assert all(n == 1 for n in seen.values())
    assert len(seen) == s.num_chips
    assert all(0 <= c < d for coord in seen for c, d in zip(coord, s.dims, strict=True))
    assert all(len(s.chip_coords(w)) == s.chips_per_host for w in range(s.num_hosts))
    hosts = {s.host_coords(w) for w in range(s.num_hosts)}
    assert len(hosts) == s.num_hosts


@pytest.mark.parametrize("worker_id", [-1, 4, 100])
def test_worker_id_out_of_range(worker_id: int) -> None:
    with pytest.raises(InvalidTopologyError, match="Worker"):
        slice_shape("v6e", "4x4").host_coords(worker_id)


@pytest.mark.parametrize(
    ("version", "topology", "chips_per_host", "match"),
    [
        ("v6e", "4x5", None, r"4x5 is not a valid topology for v6e\. Valid: 1x1, 2x2, "),
        ("v4", "4x4", None, "not a valid topology for v4"),
        ("v5p", "2x2", None, "not a valid topology for v5p"),
        ("v6e", "2x2x2", None, "not a valid topology for v6e"),
        ("v6e", "3x3", None, "not a valid topology"),
        ("v2", "2x2", None, "not a valid topology for v2"),
        ("v7x", "16x16x16", None, "not a valid topology for v7x"),
        ("v9", "4x4", None, "Unknown TPU generation 'v9'"),
        ("v6e", "4x", None, "is not a topology"),
        ("v6e", "4*4", None, "is not a topology"),
        ("v6e", "", None, "is not a topology"),
        ("v4", "2x2x2x2", None, "is not a topology"),
        ("v6e", "1x1", 4, "does not fit"),
        ("v6e", "4x4", 3, "does not fit"),
        ("v6e", "4x4", 16, "does not fit"),
        ("v5p", "2x2x4", 8, "cannot tile"),
    ],
)
def test_invalid_shapes(version: str, topology: str, chips_per_host: int | None,
                        match: str) -> None:
    with pytest.raises(InvalidTopologyError, match=match) as info:
        slice_shape(version, topology, chips_per_host)
    assert info.value.fix  # every error says what to do next
    assert isinstance(info.value, ValueError)


def test_v4_2d_topology_says_v4_is_3d() -> None:
    with pytest.raises(InvalidTopologyError) as info:
        slice_shape("v4", "4x4")
    assert "3-D" in info.value.why


@pytest.mark.parametrize(
    ("spec", "version", "topology"),
    [
        ("v6e:4x4", "v6e", "4x4"), ("v5e:2x2", "v5litepod", "2x2"), ("v4:2x2x2", "v4", "2x2x2"),
        ("tpu7x:2x2x1", "v7x", "2x2x1"), (" V6E : 4X4 ", "v6e", "4x4"),
        ("TPU-V5P:2x2x4", "v5p", "2x2x4"), ("v5litepod:16x16", "v5litepod", "16x16"),
    ],
)
def test_parse_spec(spec: str, version: str, topology: str) -> None:
    s = parse_spec(spec)
    assert (s.version, s.topology) == (version, topology)
    assert parse_spec(s.spec) == s


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("v6e-16", "Cannot read TPU spec"), ("v6e", "Cannot read TPU spec"),
        ("4x4", "Cannot read TPU spec"), ("", "Cannot read TPU spec"),
        (":4x4", "Cannot read TPU spec"), ("v6e:", "Cannot read TPU spec"),
        ("v6e:4x4:extra", "is not a topology"), ("v9:4x4", "Unknown TPU generation"),
        ("v6e:4x5", "not a valid topology"), ("v4:4x4", "not a valid topology"),
    ],
)
def test_parse_spec_rejects(spec: str, match: str) -> None:
    with pytest.raises(InvalidTopologyError, match=match) as info:
        parse_spec(spec)
    if "Cannot read" in match:
        assert "'v6e:4x4'" in info.value.fix  # shows the right form


@pytest.mark.parametrize(
    ("pod_type", "expected"),
    [("v6e-16", ("v6e", 16)), ("tpu7x-8", ("v7x", 8)), ("v5litepod-4", ("v5litepod", 4)),
     ("v4-16", ("v4", 16))],
)
def test_split_pod_type(pod_type: str, expected: tuple[str, int]) -> None:
    assert split_pod_type(pod_type) == expected


@pytest.mark.parametrize("pod_type", ["v6e", "v6e-", "-16", "v9-16", "v6e-x"])
def test_split_pod_type_rejects(pod_type: str) -> None:
    with pytest.raises(InvalidTopologyError):
        split_pod_type(pod_type)


def test_shape_constructors_agree_and_normalize() -> None:
    a = SliceShape("TPU-V6E", "4X4")
    assert a == SliceShape.of("v6e", "4x4") == slice_shape("v6e", "4x4") == parse_spec("v6e:4x4")
    assert (a.version, a.topology, a.chips_per_host) == ("v6e", "4x4", 4)
    assert SliceShape.of("v6e", "2x4") != SliceShape.of("v6e", "2x4", chips_per_host=4)
    assert hash(a) == hash(parse_spec("v6e:4x4"))


@pytest.mark.parametrize(
    ("version", "topology", "devices_per_host", "num_devices"),
    [("v6e", "4x4", 4, 16), ("v4", "2x2x2", 4, 8), ("v7x", "2x2x1", 8, 8), ("v3", "4x4", 8, 32)],
)
def test_devices(version: str, topology: str, devices_per_host: int, num_devices: int) -> None:
    s = slice_shape(version, topology)
    assert (s.devices_per_host, s.num_devices) == (devices_per_host, num_devices)


def _mesh_links(dims: tuple[int, ...]) -> int:
    return sum((d - 1) * math.prod(dims) // d for d in dims)


@pytest.mark.parametrize(
    ("version", "topology", "expected"),
    [
        ("v6e", "1x1", 0),
        ("v6e", "2x2", 4),
        ("v6e", "4x4", 24),  # mesh: 3*4 + 3*4
        ("v6e", "8x16", _mesh_links((8, 16)) + 8),  # only the 16-long axis wraps
        ("v6e", "16x16", 2 * 256),  # full pod: 2D torus
        ("v4", "2x2x2", 12),  # cube of 8: mesh
        ("v4", "2x2x4", _mesh_links((2, 2, 4))),
        ("v4", "4x4x8", 3 * 128),  # whole cubes: 3D torus
        ("v5p", "4x4x4", 3 * 64),
        ("v7x", "2x2x1", 4),
    ],
)
def test_ici_link_counts(version: str, topology: str, expected: int) -> None:
    links = ici_links(slice_shape(version, topology))
    assert len(links) == expected
    assert len(set(links)) == len(links)
    assert all(a < b for a, b in links)


def test_ici_links_join_neighbours_only() -> None:
    s = slice_shape("v5p", "4x4x4")
    for a, b in ici_links(s):
        steps = [min((x - y) % d, (y - x) % d) for x, y, d in zip(a, b, s.dims, strict=True)]
        assert sorted(steps) == [0, 0, 1]  # one hop along exactly one axis (wrap included)
    assert ((0, 0, 0), (3, 0, 0)) in ici_links(s)  # wraparound along x
    assert ((0, 0, 0), (0, 3, 0)) not in ici_links(slice_shape("v5p", "2x4x4"))  # mesh
    assert ((0, 0), (0, 15)) in ici_links(slice_shape("v6e", "16x16"))
    assert ((0, 0), (0, 3)) not in ici_links(slice_shape("v6e", "4x4"))
