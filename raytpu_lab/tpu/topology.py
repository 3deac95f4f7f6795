"""TPU generations, slice topologies, host/chip grids and ICI links; pure (stdlib only).

The topology tables are our own copy of Ray's: :data:`GENERATIONS` ``[v].valid_topologies``
mirrors ``ray._private.accelerators.tpu.VALID_TPU_TOPOLOGY`` in Ray 2.60.0, including the "larger
3D topologies" Ray generates with ``_get_larger_3d_topologies(max_x, max_y, max_z)`` for v4
(12, 12, 16) and v5p (16, 16, 24). ``tests/unit/test_topology_matches_ray.py`` checks every entry
against the installed Ray, so a Ray upgrade that changes the table fails there, not here.

Coordinates follow GKE's bounds variables (``TPU_CHIPS_PER_HOST_BOUNDS=2,2,1``): the topology
``AxB[xC]`` has ``A`` chips along x, ``B`` along y (and ``C`` along z). A coordinate is
``(x, y)`` or ``(x, y, z)``, 0-based.

Example::

    >>> s = parse_spec("v6e:4x4")
    >>> s.pod_type, s.num_hosts, s.chips_per_host, s.head_resource
    ('v6e-16', 4, 4, 'TPU-v6e-16-head')
    >>> s.chip_coords(1)
    [(2, 0), (3, 0), (2, 1), (3, 1)]
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass

from raytpu_lab.errors import InvalidTopologyError

__all__ = [
    "Coord",
    "Generation",
    "GENERATIONS",
    "SliceShape",
    "normalize_version",
    "valid_topologies",
    "nearest_topologies",
    "slice_shape",
    "parse_spec",
    "split_pod_type",
    "ici_links",
]

Coord = tuple[int, ...]
"""A chip's (or host's) position: ``(x, y)`` on 2-D generations, ``(x, y, z)`` on 3-D ones."""

_DEFAULT_CHIPS_PER_HOST = 4  # Ray: DEFAULT_TPU_NUM_CHIPS_PER_HOST
_CHIPS_PER_HOST_OPTIONS = (1, 2, 4, 8)  # Ray: TPU_VALID_CHIP_OPTIONS
_EIGHT_CHIP_HOST_VERSIONS = ("v5litepod", "v6e")  # Ray: TPU_8_CHIPS_PER_HOST_TYPES
_SINGLE_HOST_TOPOLOGIES = ("1x1", "2x2", "2x4")  # Ray: TPU_SINGLE_HOST_TOPOLOGIES
# The block one host's chips form (x, y); Ray's TPU_CHIPS_PER_HOST_BOUNDS_{1,2}_CHIP_CONFIG and
# GKE's device plugin ("2,2,1" for 4 chips, "2,4,1" for an 8-chip v5e/v6e host).
_HOST_BLOCK_2D: dict[int, tuple[int, int]] = {1: (1, 1), 2: (1, 2), 4: (2, 2), 8: (2, 4)}
# Pod edge of the 2-D generations (chips per side of a full pod): v2 16x16, v3 32x32,
# v5e and v6e 16x16 (Google Cloud "TPU v5e" / "TPU v6e" pages: 256 chips, 2D torus).
_POD_EDGE_2D = {"v2": 16, "v3": 32, "v5litepod": 16, "v6e": 16}
_TOPOLOGY_RE = re.compile(r"^\d+(x\d+){1,2}$")
_SPEC_RE = re.compile(r"^\s*([A-Za-z][A-Za-z0-9-]*)\s*:\s*(\S+)\s*$")
_SPEC_EXAMPLES = "'v6e:4x4', 'v5e:2x2', 'v4:2x2x2' or 'tpu7x:2x2x1'"


def _larger_3d_topologies(max_x: int, max_y: int, max_z: int) -> frozenset[str]:
    """Mirror of Ray's ``_get_larger_3d_topologies``: every ``XxYxZ`` with each side a multiple
    of 4 (whole 4x4x4 cubes) up to the given maxima, in every axis order."""
    step = _DEFAULT_CHIPS_PER_HOST
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
    if not _TOPOLOGY_RE.match(text):
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


def _listing(version: str, limit: int = 14) -> str:
    names = valid_topologies(version)
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown}, ... ({len(names)} in all)"


def _ray_default_chips_per_host(version: str, topology: str, num_chips: int) -> int:
    """Ray's ``get_chips_per_host``: 4, but v5e/v6e 1x1, 2x2 and 2x4 are one host of all chips."""
    if version in _EIGHT_CHIP_HOST_VERSIONS and topology in _SINGLE_HOST_TOPOLOGIES:
        return num_chips
    return _DEFAULT_CHIPS_PER_HOST


@dataclass(frozen=True)
class SliceShape:
    """One TPU slice's generation and topology, validated; every other figure is derived.

    Construct with :func:`slice_shape`, :meth:`SliceShape.of` or :func:`parse_spec`; the plain
    constructor normalizes and validates the same way, so every instance is a valid shape.

    Attributes:
        version: Ray's accelerator version, e.g. ``"v6e"``.
        topology: Chips along each axis, e.g. ``"4x4"`` or ``"2x2x2"`` (lower case).
        chips_per_host: Chips on each host (TPU VM, one Ray node; the host's ``TPU`` resource).
            Pass 0 (the default) for Ray's rule (``get_chips_per_host``): 4, except v5litepod
            and v6e 1x1, 2x2 and 2x4, which are one host holding all their chips. Override it
            for other machine types, e.g. v6e 2x4 on ``ct6e-standard-4t`` is 2 hosts of 4.
    """

    version: str
    topology: str
    chips_per_host: int = 0

    def __post_init__(self) -> None:
        version = normalize_version(self.version)
        topology = str(self.topology).strip().lower()
        gen = GENERATIONS[version]
        if not _TOPOLOGY_RE.match(topology):
            raise InvalidTopologyError(
                f"{self.topology!r} is not a topology.",
                f"A topology is chips along each axis, {gen.ndims}-D for {version}, "
                f"e.g. {valid_topologies(version)[1]!r}.",
                f"Use one of: {_listing(version)}.",
                version=version, topology=str(self.topology),
                nearest=nearest_topologies(version, topology),
            )
        ndims = topology.count("x") + 1
        if topology not in gen.valid_topologies:
            nearest = nearest_topologies(version, topology)
            why = (f"{version} is a {gen.ndims}-D generation; its topologies have {gen.ndims} "
                   "dimensions." if ndims != gen.ndims else
                   f"Ray 2.60 (VALID_TPU_TOPOLOGY) accepts only these for {version}.")
            raise InvalidTopologyError(
                f"{version} {topology} is not a valid topology for {version}. "
                f"Valid: {_listing(version)}.",
                why,
                f"Pick a valid one; nearest: {', '.join(nearest)} ({version}).",
                version=version, topology=topology, nearest=nearest,
            )
        num_chips = math.prod(int(d) for d in topology.split("x"))
        cph = self.chips_per_host or _ray_default_chips_per_host(version, topology, num_chips)
        if cph not in _CHIPS_PER_HOST_OPTIONS or cph > num_chips or num_chips % cph:
            raise InvalidTopologyError(
                f"chips_per_host={cph} does not fit {version} {topology} ({num_chips} chip(s)).",
                f"A host has {', '.join(map(str, _CHIPS_PER_HOST_OPTIONS))} chips (Ray's "
                "TPU_VALID_CHIP_OPTIONS), at most the slice's chips, and must divide them.",
                "Leave chips_per_host unset for Ray's default.",
            )
        object.__setattr__(self, "version", version)
        object.__setattr__(self, "topology", topology)
        object.__setattr__(self, "chips_per_host", cph)
        block = self.chips_per_host_bounds
        if any(d % b for d, b in zip(self.dims, block, strict=True)):
            raise InvalidTopologyError(
                f"Hosts of {cph} chips cannot tile {version} {topology}.",
                f"Each host holds a {'x'.join(map(str, block))} block of chips.",
                "Use another chips_per_host, or leave it unset for Ray's default.",
            )

    @classmethod
    def of(cls, version: str, topology: str, chips_per_host: int | None = None) -> SliceShape:
        """Same as :func:`slice_shape`."""
        return cls(version, topology, chips_per_host or 0)

    # --- names -------------------------------------------------------------------------------

    @property
    def generation(self) -> Generation:
        """The :class:`Generation` record."""
        return GENERATIONS[self.version]

    @property
    def spec(self) -> str:
        """``"<version>:<topology>"``, the form :func:`parse_spec` reads, e.g. ``"v6e:4x4"``."""
        return f"{self.version}:{self.topology}"

    @property
    def accelerator_type(self) -> str:
        """Ray's accelerator type, e.g. ``"TPU-V6E"`` (label ``ray.io/accelerator-type``)."""
        return self.generation.accelerator_type

    @property
    def pod_type(self) -> str:
        """Pod type, ``<version>-<TensorCores>``, e.g. ``"v6e-16"``, ``"v4-16"`` for v4 2x2x2.

        As Ray's ``infer_tpu_pod_type_from_topology`` and label ``ray.io/tpu-pod-type``.
        """
        return f"{self.version}-{self.num_cores}"

    @property
    def gke_accelerator_type(self) -> str:
        """``TPU_ACCELERATOR_TYPE`` as GKE sets it: the pod type, but ``"tpu7x-8"`` for v7x."""
        return f"{self.generation.gke_type_prefix}-{self.num_cores}"

    @property
    def head_resource(self) -> str:
        """The Ray resource only worker 0 carries, e.g. ``"TPU-v6e-16-head"``."""
        return f"TPU-{self.pod_type}-head"

    # --- sizes -------------------------------------------------------------------------------

    @property
    def dims(self) -> tuple[int, ...]:
        """Chips along each axis, ``(x, y)`` or ``(x, y, z)``; ``(4, 4)`` for ``"4x4"``."""
        return tuple(int(d) for d in self.topology.split("x"))

    @property
    def num_chips(self) -> int:
        """Chips in the slice."""
        return math.prod(self.dims)

    @property
    def num_cores(self) -> int:
        """TensorCores in the slice (the number in the pod type)."""
        return self.num_chips * self.generation.cores_per_chip

    @property
    def num_hosts(self) -> int:
        """Hosts (TPU VMs = Ray nodes) in the slice: ``max(1, num_chips // chips_per_host)``."""
        return max(1, self.num_chips // self.chips_per_host)

    @property
    def devices_per_host(self) -> int:
        """JAX devices per host (logical), vs :attr:`chips_per_host` (physical)."""
        return self.chips_per_host * self.generation.devices_per_chip

    @property
    def num_devices(self) -> int:
        """JAX devices in the slice (``jax.device_count()`` on one slice)."""
        return self.num_chips * self.generation.devices_per_chip

    # --- host grid ---------------------------------------------------------------------------

    @property
    def chips_per_host_bounds(self) -> tuple[int, ...]:
        """The block of chips one host holds, per axis: ``(2, 2)`` / ``(2, 2, 1)`` for 4 chips.

        A single-host slice's block is the whole slice (v6e 2x4 on one host: ``(2, 4)``).
        """
        if self.chips_per_host >= self.num_chips:
            return self.dims
        block = _HOST_BLOCK_2D[self.chips_per_host]
        return block if len(self.dims) == 2 else (*block, 1)

    @property
    def host_grid(self) -> tuple[int, ...]:
        """Hosts along each axis, e.g. ``(2, 2)`` for v6e 4x4, ``(1, 1, 2)`` for v4 2x2x2."""
        return tuple(d // b for d, b in zip(self.dims, self.chips_per_host_bounds, strict=True))

    @property
    def chips_per_host_bounds_env(self) -> str:
        """``TPU_CHIPS_PER_HOST_BOUNDS`` as GKE's device plugin sets it, e.g. ``"2,2,1"``."""
        return _env_triple(self.chips_per_host_bounds)

    @property
    def host_bounds_env(self) -> str:
        """``TPU_HOST_BOUNDS`` as GKE's device plugin sets it, e.g. ``"2,2,1"`` for v6e 4x4."""
        return _env_triple(self.host_grid)

    def host_coords(self, worker_id: int) -> Coord:
        """A host's position in :attr:`host_grid`; worker ids run row-major, x fastest.

        This is the nominal placement (Ray's ``_get_physical_worker_id_from_coords`` uses the
        same order). On GKE, ``TPU_WORKER_ID`` comes from the pod's host index, and Ray 2.60
        recovers the physical position from libtpu's chip coordinates.

        Args:
            worker_id: 0-based host index in the slice (0 is the head).

        Raises:
            InvalidTopologyError: ``worker_id`` is outside ``0 .. num_hosts - 1``.
        """
        if not 0 <= worker_id < self.num_hosts:
            raise InvalidTopologyError(
                f"Worker {worker_id} is not in {self.pod_type} ({self.topology}).",
                f"It has {self.num_hosts} host(s), worker ids 0..{self.num_hosts - 1}.",
                "Use a worker id in that range.",
            )
        coords = []
        rest = worker_id
        for n in self.host_grid:
            rest, c = divmod(rest, n)
            coords.append(c)
        return tuple(coords)

    def chip_coords(self, worker_id: int) -> list[Coord]:
        """Slice coordinates of the chips on one host, x fastest.

        Args:
            worker_id: 0-based host index in the slice.

        Returns:
            :attr:`chips_per_host` coordinates, e.g. ``[(2, 0), (3, 0), (2, 1), (3, 1)]`` for
            worker 1 of v6e 4x4.
        """
        origin = [h * b for h, b in zip(self.host_coords(worker_id), self.chips_per_host_bounds,
                                        strict=True)]
        ranges = [range(o, o + b) for o, b in zip(origin, self.chips_per_host_bounds, strict=True)]
        return [tuple(reversed(c)) for c in itertools.product(*reversed(ranges))]

    # --- ICI ---------------------------------------------------------------------------------

    @property
    def wraparound(self) -> tuple[bool, ...]:
        """Whether ICI wraps around (torus) along each axis; our model, see :func:`ici_links`."""
        dims = self.dims
        if self.generation.ndims == 3:
            full_cubes = all(d % 4 == 0 for d in dims)
            return tuple(full_cubes for _ in dims)
        edge = _POD_EDGE_2D[self.version]
        return tuple(d == edge for d in dims)

    @property
    def topology_wrap_env(self) -> str:
        """``TPU_TOPOLOGY_WRAP`` in GKE's form, e.g. ``"true,true,true"`` for v4 4x4x8."""
        flags = [*self.wraparound, *([False] * (3 - len(self.dims)))]
        return ",".join("true" if f else "false" for f in flags)


def _env_triple(values: tuple[int, ...]) -> str:
    return ",".join(str(v) for v in (*values, *([1] * (3 - len(values)))))


def slice_shape(version: str, topology: str, chips_per_host: int | None = None) -> SliceShape:
    """A validated :class:`SliceShape`.

    Args:
        version: Generation in any spelling :func:`normalize_version` accepts.
        topology: e.g. ``"4x4"`` (2-D generations) or ``"2x2x2"`` (3-D ones).
        chips_per_host: Override of Ray's chips-per-host rule (1, 2, 4 or 8); ``None`` for Ray's.

    Raises:
        InvalidTopologyError: Unknown generation, a topology Ray would refuse, or hosts of
            ``chips_per_host`` chips that cannot tile the slice.
    """
    return SliceShape(version, topology, chips_per_host or 0)


def parse_spec(spec: str) -> SliceShape:
    """Read ``"<version>:<topology>"``, e.g. ``"v6e:4x4"``, ``"v5e:2x2"``, ``"tpu7x:2x2x1"``.

    Raises:
        InvalidTopologyError: The string is not of that form, or names no valid shape.
    """
    match = _SPEC_RE.match(spec) if isinstance(spec, str) else None
    if not match:
        raise InvalidTopologyError(
            f"Cannot read TPU spec {spec!r}.",
            "A spec is '<accelerator version>:<topology>'.",
            f"Write it like {_SPEC_EXAMPLES}.",
        )
    return SliceShape(match.group(1), match.group(2))


def split_pod_type(pod_type: str) -> tuple[str, int]:
    """Split a pod type into Ray's version and its TensorCore count.

    Args:
        pod_type: e.g. ``"v6e-16"``, or GKE's ``"tpu7x-8"``.

    Returns:
        ``(version, cores)``, e.g. ``("v6e", 16)``, ``("v7x", 8)``.

    Raises:
        InvalidTopologyError: Not ``<generation>-<number>``, or an unknown generation.
    """
    head, sep, tail = str(pod_type).strip().rpartition("-")
    if not sep or not tail.isdecimal() or not head:
        raise InvalidTopologyError(
            f"Cannot read pod type {pod_type!r}.",
            "A pod type is '<accelerator version>-<TensorCores>'.",
            "Write it like 'v6e-16', 'v4-16' or 'tpu7x-8'.",
        )
    return normalize_version(head), int(tail)


def ici_links(shape: SliceShape) -> list[tuple[Coord, Coord]]:
    """ICI links between neighbouring chips of a slice, each once, ``(lower, higher)`` ends.

    Chips link to their +1 neighbour along every axis (a mesh). An axis that wraps
    (:attr:`SliceShape.wraparound`) also links its last chip to its first (a torus ring):

    - v4, v5p, v7x (3-D): all axes wrap when the slice is whole 4x4x4 cubes (every side a
      multiple of 4). Google Cloud's v5p page: "All 4x4x4 and larger slices (one cube) have
      full 3D torus"; the v4 page describes a 3D mesh configurable as a 3D torus; a recorded
      v4 4x4x8 host shows ``TPU_TOPOLOGY_WRAP='true,true,true'``. Twisted tori are not modelled.
    - v5e, v6e, v2, v3 (2-D): an axis wraps only when it spans the full pod (16 chips; 32 on
      v3). The v5e and v6e pages give the 256-chip pod as a "2D torus"; smaller slices are
      meshes without wraparound.

    Args:
        shape: The slice.

    Returns:
        ``[(a, b), ...]`` sorted, with ``a < b`` as tuples.
    """
    dims = shape.dims
    wrap = shape.wraparound
    links: set[tuple[Coord, Coord]] = set()
    for chip in itertools.product(*(range(d) for d in dims)):
        for axis, size in enumerate(dims):
            nxt = chip[axis] + 1
            if nxt == size:
                if not wrap[axis] or size <= 2:
                    continue
                nxt = 0
            other = (*chip[:axis], nxt, *chip[axis + 1:])
            links.add((min(chip, other), max(chip, other)))
    return sorted(links)
