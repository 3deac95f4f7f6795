"""TPU generations and the topologies Ray accepts for each; pure (stdlib only).

The topology tables are our own copy of Ray's: :data:`GENERATIONS` ``[v].valid_topologies``
mirrors ``ray._private.accelerators.tpu.VALID_TPU_TOPOLOGY`` in Ray 2.60.0, including the "larger
3D topologies" Ray generates with ``_get_larger_3d_topologies(max_x, max_y, max_z)`` for v4
(12, 12, 16) and v5p (16, 16, 24). ``tests/unit/test_topology_matches_ray.py`` checks every entry
against the installed Ray, so a Ray upgrade that changes the table fails there, not here.
:mod:`raytpu_lab.tpu.topology` builds slice shapes on these tables.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from raytpu_lab.errors import InvalidTopologyError

__all__ = [
    "Generation",
    "GENERATIONS",
    "normalize_version",
    "valid_topologies",
    "nearest_topologies",
]

DEFAULT_CHIPS_PER_HOST = 4  # Ray: DEFAULT_TPU_NUM_CHIPS_PER_HOST
CHIPS_PER_HOST_OPTIONS = (1, 2, 4, 8)  # Ray: TPU_VALID_CHIP_OPTIONS
_EIGHT_CHIP_HOST_VERSIONS = ("v5litepod", "v6e")  # Ray: TPU_8_CHIPS_PER_HOST_TYPES
_SINGLE_HOST_TOPOLOGIES = ("1x1", "2x2", "2x4")  # Ray: TPU_SINGLE_HOST_TOPOLOGIES
# The block one host's chips form (x, y); Ray's TPU_CHIPS_PER_HOST_BOUNDS_{1,2}_CHIP_CONFIG and
# GKE's device plugin ("2,2,1" for 4 chips, "2,4,1" for an 8-chip v5e/v6e host).
HOST_BLOCK_2D: dict[int, tuple[int, int]] = {1: (1, 1), 2: (1, 2), 4: (2, 2), 8: (2, 4)}
# Pod edge of the 2-D generations (chips per side of a full pod): v2 16x16, v3 32x32,
# v5e and v6e 16x16 (Google Cloud "TPU v5e" / "TPU v6e" pages: 256 chips, 2D torus).
POD_EDGE_2D = {"v2": 16, "v3": 32, "v5litepod": 16, "v6e": 16}
TOPOLOGY_RE = re.compile(r"^\d+(x\d+){1,2}$")
SPEC_RE = re.compile(r"^\s*([A-Za-z][A-Za-z0-9-]*)\s*:\s*(\S+)\s*$")
SPEC_EXAMPLES = "'v6e:4x4', 'v5e:2x2', 'v4:2x2x2' or 'tpu7x:2x2x1'"


def _larger_3d_topologies(max_x: int, max_y: int, max_z: int) -> frozenset[str]:
    """Mirror of Ray's ``_get_larger_3d_topologies``: every ``XxYxZ`` with each side a multiple
    of 4 (whole 4x4x4 cubes) up to the given maxima, in every axis order."""
    step = DEFAULT_CHIPS_PER_HOST
    return frozenset(
        f"{x}x{y}x{z}"
        for x in range(step, max_x + 1, step)
        for y in range(step, max_y + 1, step)
        for z in range(step, max_z + 1, step)
    )


_SMALL_3D = frozenset({"2x2x1", "2x2x2", "2x2x4", "2x4x4"})
_LITE_2D = frozenset({"1x1", "2x2", "2x4", "2x8", "4x4", "4x8", "8x8", "8x16", "16x16"})

# Ray 2.60.0 ``VALID_TPU_TOPOLOGY``, entry for entry.
_RAY_VALID_TPU_TOPOLOGY: dict[str, frozenset[str]] = {
    "v2": frozenset({"4x4", "4x8", "8x8", "8x16", "16x16"}),
    "v3": frozenset({"4x4", "4x8", "8x8", "8x16", "16x16", "16x32", "32x32"}),
    "v4": _SMALL_3D | _larger_3d_topologies(12, 12, 16),
    "v5p": _SMALL_3D | _larger_3d_topologies(16, 16, 24),
    "v5litepod": _LITE_2D,
    "v6e": _LITE_2D,
    "v7x": _SMALL_3D | frozenset(
        {"4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16", "8x16x16"}
    ),
}


@dataclass(frozen=True)
class Generation:
    """One TPU generation, in Ray's and GKE's names.

    Attributes:
        version: Ray's accelerator version, e.g. ``"v6e"`` (the key of :data:`GENERATIONS`).
        accelerator_type: Ray's accelerator type resource/label value, e.g. ``"TPU-V6E"``.
        cores_per_chip: TensorCores per chip, as Ray's ``get_tpu_cores_per_chip``: 1 for
            v5litepod and v6e, 2 for the rest. The number in a pod type counts cores.
        devices_per_chip: JAX devices per chip: 2 on v2/v3 (one per core) and v7x (Ray notes
            "2 logical XLA devices per chip"), 1 on v4/v5p (megacore) and v5litepod/v6e.
        ndims: Dimensions of a topology: 2 (v2, v3, v5litepod, v6e) or 3 (v4, v5p, v7x).
        gke_accelerator: GKE node selector ``cloud.google.com/gke-tpu-accelerator``,
            e.g. ``"tpu-v6e-slice"``; ``None`` where GKE offers none (v2, v3).
        gke_type_prefix: Prefix GKE puts in ``TPU_ACCELERATOR_TYPE``: ``"tpu7x"`` for v7x,
            else the version.
        valid_topologies: Topologies Ray 2.60 accepts for this generation.
    """

    version: str
    accelerator_type: str
    cores_per_chip: int
    devices_per_chip: int
    ndims: int
    gke_accelerator: str | None
    gke_type_prefix: str
    valid_topologies: frozenset[str]


def _generation(version: str, cores: int, devices: int, ndims: int, gke: str | None,
                prefix: str | None = None) -> Generation:
    return Generation(version=version, accelerator_type=f"TPU-{version.upper()}",
                      cores_per_chip=cores, devices_per_chip=devices, ndims=ndims,
                      gke_accelerator=gke, gke_type_prefix=prefix or version,
                      valid_topologies=_RAY_VALID_TPU_TOPOLOGY[version])


GENERATIONS: dict[str, Generation] = {
    g.version: g
    for g in (
        _generation("v2", 2, 2, 2, None),
        _generation("v3", 2, 2, 2, None),
        _generation("v4", 2, 1, 3, "tpu-v4-podslice"),
        _generation("v5p", 2, 1, 3, "tpu-v5p-slice"),
        _generation("v5litepod", 1, 1, 2, "tpu-v5-lite-podslice"),
        _generation("v6e", 1, 1, 2, "tpu-v6e-slice"),
        _generation("v7x", 2, 2, 3, "tpu7x", prefix="tpu7x"),
    )
}
"""Every generation Ray 2.60 knows (``VALID_TPU_TYPES``), keyed by Ray's accelerator version."""

_ALIASES = {
    "v5e": "v5litepod", "v5lite": "v5litepod", "v5litepod": "v5litepod",
    "v7": "v7x", "tpu7x": "v7x", "tpu7": "v7x",
    "tpu-v5-lite-device": "v5litepod",
    **{g.gke_accelerator: g.version for g in GENERATIONS.values() if g.gke_accelerator},
}


def normalize_version(name: str) -> str:
    """Ray's accelerator version for a generation name in any common spelling.

    Accepts Ray's versions (``"v6e"``, ``"V6E"``), Ray's accelerator types (``"TPU-V6E"``),
    Google's short names (``"v5e"``, ``"v5lite"`` -> ``"v5litepod"``; ``"tpu7x"`` -> ``"v7x"``)
    and GKE accelerator selectors (``"tpu-v6e-slice"``, ``"tpu-v5-lite-podslice"``).

    Args:
        name: The generation name.

    Returns:
        A key of :data:`GENERATIONS`, e.g. ``"v6e"``.

    Raises:
        InvalidTopologyError: The name is no known generation.
    """
    key = str(name).strip().lower()
    if key in _ALIASES:
        return _ALIASES[key]
    bare = re.sub(r"^tpu-?", "", key)
    bare = _ALIASES.get(bare, bare)
    if bare in GENERATIONS:
        return bare
    known = ", ".join(GENERATIONS)
    raise InvalidTopologyError(
        f"Unknown TPU generation {name!r}.",
        f"Ray 2.60 knows {known}.",
        "Use one of those; 'v5e' and 'tpu7x' are accepted for v5litepod and v7x.",
    )


def _topology_key(topology: str) -> tuple[int, tuple[int, ...]]:
    dims = tuple(int(d) for d in topology.split("x"))
    return math.prod(dims), dims


def valid_topologies(version: str) -> list[str]:
    """Topologies Ray 2.60 accepts for a generation, smallest chip count first.

    Args:
        version: A generation name (see :func:`normalize_version`).

    Returns:
        e.g. ``["1x1", "2x2", "2x4", "2x8", "4x4", ...]`` for ``"v6e"``; ties in chip count are
        ordered by their dimensions.
    """
    return sorted(GENERATIONS[normalize_version(version)].valid_topologies, key=_topology_key)


def nearest_topologies(version: str, topology: str, count: int = 3) -> list[str]:
    """The valid topologies of a generation nearest to ``topology``, nearest first.

    Nearest means closest in chip count (by ratio: 20 chips is nearer 16 than 32), then in the
    chips along each axis (a missing axis counts as 1), then fewer chips. A topology that does
    not parse (``"abc"``) has no chip count: the smallest valid ones are returned.

    Args:
        version: A generation name (see :func:`normalize_version`).
        topology: What was asked for, e.g. ``"4x5"``.
        count: How many to return, at most.

    Returns:
        e.g. ``["4x4", "2x8", "4x8"]`` for ``("v6e", "4x5")``.

    Raises:
        InvalidTopologyError: The generation is unknown.
    """
    names = valid_topologies(version)
    text = str(topology).strip().lower()
    if not TOPOLOGY_RE.match(text):
        return names[:count]
    want = [int(d) for d in text.split("x")]
    chips = max(1, math.prod(want))

    def distance(name: str) -> tuple[float, int, int]:
        dims = [int(d) for d in name.split("x")]
        n = max(len(dims), len(want))
        a = sorted(dims + [1] * (n - len(dims)))
        b = sorted(want + [1] * (n - len(want)))
        return (abs(math.log(math.prod(dims) / chips)),
                sum(abs(x - y) for x, y in zip(a, b, strict=True)), math.prod(dims))

    return sorted((n for n in names if n != text), key=distance)[:count]


def topology_listing(version: str, limit: int = 14) -> str:
    names = valid_topologies(version)
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown}, ... ({len(names)} in all)"


def ray_default_chips_per_host(version: str, topology: str, num_chips: int) -> int:
    """Ray's ``get_chips_per_host``: 4, but v5e/v6e 1x1, 2x2 and 2x4 are one host of all chips."""
    if version in _EIGHT_CHIP_HOST_VERSIONS and topology in _SINGLE_HOST_TOPOLOGIES:
        return num_chips
    return DEFAULT_CHIPS_PER_HOST
