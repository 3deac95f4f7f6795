"""Slices whose labels name no shape in the topology tables, drawn from what Ray reports.

Ray labels any host it detects as a TPU (``ray.io/tpu-slice-name``, ``ray.io/tpu-worker-id``,
``ray.io/tpu-pod-type``, ``ray.io/tpu-topology``), including shapes our copy of Ray's
``VALID_TPU_TOPOLOGY`` lacks: a v2-8 or v3-8 TPU VM is one host of topology ``2x2``, which that
table has no entry for. Such a slice is still drawn, as an :class:`UnknownShape`: its hosts and
their chips come from Ray's resources, and the layout is a schematic grid, not the physical one
(no ICI links are claimed).

How many hosts it has, in order of trust:

1. ``num_hosts`` when the caller knows (the emulator does);
2. Ray's own rule (``get_num_workers_in_current_tpu_pod``) when the pod type names a known
   generation: TensorCores in the pod type over cores per host (the host's ``TPU`` chips times the
   generation's cores per chip), rounded up; e.g. ``v2-8`` with 4 chips per host is 1 host;
3. else the chips a parseable topology names over chips per host, rounded up;
4. else the hosts seen (highest worker id + 1), at most :data:`MAX_UNKNOWN_HOSTS`.

Example::

    >>> s, notes = unknown_shape("v2-8", "TPU-V2", "2x2", chips_per_host=4, hosts_seen=1)
    >>> s.version, s.num_hosts, s.num_chips, s.head_resource, notes
    ('v2', 1, 4, 'TPU-v2-8-head', [])
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from raytpu_lab.errors import InvalidTopologyError
from raytpu_lab.tpu.generations import GENERATIONS, HOST_BLOCK_2D, TOPOLOGY_RE, normalize_version
from raytpu_lab.tpu.topology import Coord, check_worker_id

__all__ = ["MAX_UNKNOWN_HOSTS", "UnknownShape", "unknown_shape"]

MAX_UNKNOWN_HOSTS = 4096
"""Most hosts drawn for a slice whose host count only its worker ids tell (a stray worker id
must not draw a million missing hosts)."""



def _block(chips: int) -> tuple[int, int]:
    """``(x, y)`` with ``x * y == chips`` and ``x <= y`` as near as possible (6 -> (2, 3))."""
    n = max(1, chips)
    if n in HOST_BLOCK_2D:  # as SliceShape's hosts of 1, 2, 4 and 8 chips
        return HOST_BLOCK_2D[n]
    x = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return x, n // x


@dataclass(frozen=True)
class UnknownShape:
    """A slice shape outside the topology tables, with the layout a view needs to draw it.

    It answers the drawing questions of :class:`~raytpu_lab.tpu.topology.SliceShape`
    (``num_hosts``, ``host_grid``, ``chips_per_host_bounds``, ``host_coords``, ``chip_coords``...)
    with a schematic 2-D grid: hosts in a near-square grid, worker ids row-major (x fastest), each
    host a block of exactly ``chips_per_host`` chips. It is not a valid shape to reserve or launch
    on; :func:`unknown_shape` builds it.

    Attributes:
        version: Ray's accelerator version when the generation is known (``"v2"``), else what the
            labels say (``"v9z"``), else ``"unknown"``.
        topology: The topology label as Ray gives it; ``""`` when absent.
        pod_type: The pod type label, e.g. ``"v2-8"``; ``""`` when absent.
        chips_per_host: Chips each host is drawn with (the largest ``TPU`` resource seen).
        num_hosts: Hosts in the slice (see the module doc for how it is found).
    """

    version: str
    topology: str
    pod_type: str
    chips_per_host: int
    num_hosts: int

    @property
    def spec(self) -> str:
        """What the labels say, e.g. ``"v2-8 (2x2)"``."""
        return f"{self.pod_type or self.version} ({self.topology or 'no topology label'})"

    @property
    def head_resource(self) -> str:
        """``TPU-<pod type>-head`` as Ray puts it on worker 0; ``""`` without a pod type."""
        return f"TPU-{self.pod_type}-head" if self.pod_type else ""

    @property
    def num_chips(self) -> int:
        """Chips drawn: ``num_hosts * chips_per_host``."""
        return self.num_hosts * self.chips_per_host

    @property
    def chips_per_host_bounds(self) -> tuple[int, int]:
        """The block one host is drawn as, e.g. ``(2, 2)`` for 4 chips."""
        return _block(self.chips_per_host)

    @property
    def host_grid(self) -> tuple[int, int]:
        """Hosts per axis: ``ceil(sqrt(num_hosts))`` wide, as many rows as needed."""
        n = max(1, self.num_hosts)
        x = math.isqrt(n - 1) + 1
        return x, -(-n // x)

    @property
    def dims(self) -> tuple[int, int]:
        """Chips per axis of the drawn grid (not a topology)."""
        (hx, hy), (bx, by) = self.host_grid, self.chips_per_host_bounds
        return hx * bx, hy * by

    @property
    def wraparound(self) -> tuple[bool, bool]:
        """No axis is known to wrap."""
        return False, False

    def host_coords(self, worker_id: int) -> Coord:
        """A host's cell in :attr:`host_grid`, row-major, x fastest.

        Raises:
            InvalidTopologyError: ``worker_id`` is outside ``0 .. num_hosts - 1``.
        """
        check_worker_id(worker_id, self.num_hosts, f"slice of unknown shape {self.spec}",
                        drawn=True)
        x = self.host_grid[0]
        return worker_id % x, worker_id // x

    def chip_coords(self, worker_id: int) -> list[Coord]:
        """Grid coordinates of one host's ``chips_per_host`` chips, x fastest."""
        (hx, hy), (bx, by) = self.host_coords(worker_id), self.chips_per_host_bounds
        return [(hx * bx + i % bx, hy * by + i // bx) for i in range(self.chips_per_host)]


def _version(pod_type: str, accelerator: str) -> tuple[str, bool]:
    """``(version, known generation)`` from the pod type, else the accelerator type label."""
    for name in (pod_type.rpartition("-")[0] if "-" in pod_type else pod_type, accelerator):
        if not name:
            continue
        try:
            return normalize_version(name), True
        except InvalidTopologyError:
            return re.sub(r"^tpu-?", "", name.strip().lower()) or "unknown", False
    return "unknown", False


def unknown_shape(pod_type: str | None, accelerator: str | None, topology: str | None, *,
                  chips_per_host: int, hosts_seen: int, num_hosts: int | None = None
                  ) -> tuple[UnknownShape, list[str]]:
    """The :class:`UnknownShape` of a slice from its labels and its hosts' ``TPU`` resource.

    Args:
        pod_type: Label ``ray.io/tpu-pod-type``, e.g. ``"v2-8"`` (may be absent).
        accelerator: Label ``ray.io/accelerator-type``, e.g. ``"TPU-V2"`` (may be absent).
        topology: Label ``ray.io/tpu-topology``, e.g. ``"2x2"`` (may be absent).
        chips_per_host: Chips on a host (the largest ``TPU`` total among the slice's nodes).
        hosts_seen: Highest worker id seen + 1.
        num_hosts: Hosts the slice should have, when the caller knows.

    Returns:
        ``(shape, notes)``: notes say what could not be derived or disagrees, e.g.
        ``["host count unknown: drawn as the 2 host(s) seen"]``.
    """
    pod, accel = (pod_type or "").strip(), (accelerator or "").strip()
    topo = (topology or "").strip().lower()
    version, known = _version(pod, accel)
    cph = max(0, chips_per_host)
    notes: list[str] = []
    tail = pod.rpartition("-")[2]
    cores = int(tail) if pod and tail.isdecimal() else 0
    cores_per_chip = GENERATIONS[version].cores_per_chip if known else 0
    named_chips = math.prod(int(d) for d in topo.split("x")) if TOPOLOGY_RE.match(topo) else 0
    if cores and cores_per_chip and named_chips and cores != named_chips * cores_per_chip:
        notes.append(f"labels inconsistent: pod type {pod} is {cores // cores_per_chip} chip(s), "
                     f"topology {topo} is {named_chips}")
    derived = 0
    if cph and cores and cores_per_chip:  # Ray's get_num_workers_in_current_tpu_pod
        derived = -(-cores // (cph * cores_per_chip))
    elif cph and named_chips:
        derived = -(-named_chips // cph)
    hosts = num_hosts or derived
    if not hosts:
        hosts = max(1, min(hosts_seen, MAX_UNKNOWN_HOSTS))
        notes.append(f"host count unknown: drawn as the {hosts} host(s) seen")
    return UnknownShape(version, topo, pod, cph, hosts), notes
