"""Slice shapes: topologies, host/chip grids and ICI links; pure (stdlib only).

A :class:`SliceShape` is a generation and topology validated against the tables of
:mod:`raytpu_lab.tpu.generations` (Ray 2.60's, re-exported here); every other figure is derived.

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
from dataclasses import dataclass

from raytpu_lab.errors import InvalidTopologyError
from raytpu_lab.tpu.generations import (
    CHIPS_PER_HOST_OPTIONS,
    GENERATIONS,
    HOST_BLOCK_2D,
    POD_EDGE_2D,
    SPEC_EXAMPLES,
    SPEC_RE,
    TOPOLOGY_RE,
    Generation,
    nearest_topologies,
    normalize_version,
    ray_default_chips_per_host,
    topology_listing,
    valid_topologies,
)

# Generation, GENERATIONS and the version/topology look-ups are re-exported: they were defined
# here before raytpu_lab.tpu.generations held them.
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
        if not TOPOLOGY_RE.match(topology):
            raise InvalidTopologyError(
                f"{self.topology!r} is not a topology.",
                f"A topology is chips along each axis, {gen.ndims}-D for {version}, "
                f"e.g. {valid_topologies(version)[1]!r}.",
                f"Use one of: {topology_listing(version)}.",
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
                f"Valid: {topology_listing(version)}.",
                why,
                f"Pick a valid one; nearest: {', '.join(nearest)} ({version}).",
                version=version, topology=topology, nearest=nearest,
            )
        num_chips = math.prod(int(d) for d in topology.split("x"))
        cph = self.chips_per_host or ray_default_chips_per_host(version, topology, num_chips)
        if cph not in CHIPS_PER_HOST_OPTIONS or cph > num_chips or num_chips % cph:
            raise InvalidTopologyError(
                f"chips_per_host={cph} does not fit {version} {topology} ({num_chips} chip(s)).",
                f"A host has {', '.join(map(str, CHIPS_PER_HOST_OPTIONS))} chips (Ray's "
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
        block = HOST_BLOCK_2D[self.chips_per_host]
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
        check_worker_id(worker_id, self.num_hosts, f"{self.pod_type} ({self.topology})")
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
        edge = POD_EDGE_2D[self.version]
        return tuple(d == edge for d in dims)

    @property
    def topology_wrap_env(self) -> str:
        """``TPU_TOPOLOGY_WRAP`` in GKE's form, e.g. ``"true,true,true"`` for v4 4x4x8."""
        flags = [*self.wraparound, *([False] * (3 - len(self.dims)))]
        return ",".join("true" if f else "false" for f in flags)


def check_worker_id(worker_id: int, num_hosts: int, where: str, *, drawn: bool = False) -> None:
    """Raise unless ``0 <= worker_id < num_hosts``.

    Args:
        worker_id: The host index asked for.
        num_hosts: Hosts of the slice.
        where: The slice as the message names it, e.g. ``"v6e-16 (4x4)"``.
        drawn: The host count is only how the slice is drawn (a shape outside the tables).

    Raises:
        InvalidTopologyError: ``worker_id`` is outside ``0 .. num_hosts - 1``.
    """
    if not 0 <= worker_id < num_hosts:
        raise InvalidTopologyError(
            f"Worker {worker_id} is not in {where}.",
            f"It {'is drawn with' if drawn else 'has'} {num_hosts} host(s), "
            f"worker ids 0..{num_hosts - 1}.",
            "Use a worker id in that range.",
        )


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
    match = SPEC_RE.match(spec) if isinstance(spec, str) else None
    if not match:
        raise InvalidTopologyError(
            f"Cannot read TPU spec {spec!r}.",
            "A spec is '<accelerator version>:<topology>'.",
            f"Write it like {SPEC_EXAMPLES}.",
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
