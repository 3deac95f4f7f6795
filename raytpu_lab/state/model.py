"""Pure cluster-state model: raw Ray state dicts -> slices, hosts and chips, with health.

:func:`build_snapshot` reads the raw state of :mod:`raytpu_lab.state.fetch` (nodes with labels and
total/available resources, placement groups with their bundles) and returns a frozen
:class:`ClusterSnapshot`. No Ray, no I/O: it runs on recorded dicts in tests and on every refresh.

How chips are counted on one host (a Ray node with TPU labels), in chips (Ray's ``TPU`` resource):

- ``reserved``: ``TPU`` held by placement-group bundles placed on the node, per owner. An owner is a
  reservation (its name, from ``reservations`` or a ``"raytpu:<name>"`` group name) or
  ``"placement group <id[:8]>"``. Ray's head-lock group (a bundle of ``TPU-<pod type>-head`` only)
  holds no chips; it marks the slice's head as locked.
- ``busy``: chips in use beyond the bundles: ``total - available - reserved``.
- ``free``: ``available``. Ray omits an exhausted resource from ``resources_available``, so a
  missing ``TPU`` key is 0 free, never "all free".

A node that is not alive is a ``"dead"`` host; a worker id the slice should have but no node claims
is a ``"missing"`` host (``node_id`` ``None``). Nodes without a slice name or a usable worker id
go to :attr:`ClusterSnapshot.other_nodes` with the reason.

A node Ray labels as a TPU host (slice name and worker id) is always a host of its slice, even
when its pod type / topology name no shape in :mod:`raytpu_lab.tpu.topology`'s tables (a v2-8 TPU
VM is topology ``2x2``, which Ray's table lacks): the slice gets an
:class:`~raytpu_lab.tpu.unknown.UnknownShape` (hosts and chips from Ray's resources, a schematic
grid) and the reason ``"unknown TPU shape v2-8 (2x2): drawn from Ray's labels and resources"``.
Such a slice is never ``"intact"``, so it is never idle and no reservation takes it: requests are
validated :class:`~raytpu_lab.tpu.topology.SliceShape` s, and handing out a slice whose hosts and
chips we cannot check against its shape could hang Ray's gang scheduling or give the wrong chips.
:meth:`ClusterSnapshot.slices_of` still lists it under its pod type label (that is what Ray
schedules on), so a refusal names it and a run's fences cover it.

On Kubernetes, ``planned`` slices (what the RayCluster asks for, with its pods' state; see
:class:`PlannedSlice`) add what Ray cannot know: a host whose pod has not joined Ray yet is
``"provisioning"`` (its ``detail`` says why, e.g. ``"Pending: Unschedulable: ..."``), a slice none of
whose hosts has joined is listed anyway, and a slice KubeRay is deleting and recreating as a unit
has ``phase`` ``"replacing"``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from raytpu_lab.errors import InvalidTopologyError
from raytpu_lab.tpu.topology import SliceShape, normalize_version, split_pod_type
from raytpu_lab.tpu.unknown import MAX_UNKNOWN_HOSTS, UnknownShape, unknown_shape

__all__ = [
    "LABEL_SLICE",
    "LABEL_WORKER",
    "LABEL_TOPOLOGY",
    "LABEL_POD_TYPE",
    "LABEL_ACCELERATOR",
    "RESERVATION_PREFIX",
    "HOST_STATES",
    "SLICE_STATES",
    "HostState",
    "SliceState",
    "OtherNode",
    "ClusterSnapshot",
    "PlannedHost",
    "PlannedSlice",
    "build_snapshot",
]

LABEL_SLICE = "ray.io/tpu-slice-name"
LABEL_WORKER = "ray.io/tpu-worker-id"
LABEL_TOPOLOGY = "ray.io/tpu-topology"
LABEL_POD_TYPE = "ray.io/tpu-pod-type"
LABEL_ACCELERATOR = "ray.io/accelerator-type"
_TPU_LABELS = (LABEL_SLICE, LABEL_WORKER, LABEL_TOPOLOGY, LABEL_POD_TYPE)
RESERVATION_PREFIX = "raytpu:"
"""Placement groups named ``"raytpu:<name>"`` are reservation ``<name>``."""
HOST_STATES = ("free", "reserved", "busy", "dead", "missing", "provisioning")
SLICE_STATES = ("free", "reserved", "busy", "partial", "degraded", "provisioning", "replacing")


@dataclass(frozen=True)
class HostState:
    """One host (TPU VM, one Ray node) of a slice.

    Attributes:
        worker_id: 0-based host index in the slice (0 is the head).
        node_id: Ray node id (hex); ``None`` for a missing host.
        ip: Node IP address; ``""`` for a missing host.
        state: One of :data:`HOST_STATES`: ``"dead"`` / ``"missing"``, else ``"reserved"`` if any
            chip is held by a bundle, ``"busy"`` if any chip is in use, else ``"free"``.
        chips: Chips the node has (its ``TPU`` total); 0 when missing.
        chips_free: Chips available now; 0 when dead or missing.
        owner: Owner holding most chips here (reservation name or ``"placement group <id8>"``).
        labels: The node's Ray labels.
        chips_reserved: Chips held by placement-group bundles.
        chips_busy: Chips in use outside any bundle.
        chips_per_host: Chips the topology expects on this host.
        detail: Why a host is not up, from Kubernetes (pod phase and reason), else ``""``.
    """

    worker_id: int
    node_id: str | None
    ip: str
    state: str
    chips: int
    chips_free: int
    owner: str | None
    labels: dict[str, str] = field(default_factory=dict)
    chips_reserved: int = 0
    chips_busy: int = 0
    chips_per_host: int = 0
    detail: str = ""

    @property
    def alive(self) -> bool:
        """The node is up (neither dead, missing nor provisioning)."""
        return self.state not in ("dead", "missing", "provisioning")

    def chip_states(self) -> list[str]:
        """Per-chip states, ``chips_per_host`` long: reserved, then busy, then free chips.

        A dead or missing host's chips are all ``"dead"`` / ``"missing"``; chips the topology
        expects but the node lacks are ``"missing"``.
        """
        n = self.chips_per_host or self.chips
        if not self.alive:
            return [self.state] * n
        states = (["reserved"] * self.chips_reserved + ["busy"] * self.chips_busy
                  + ["free"] * self.chips_free)
        return (states + ["missing"] * n)[:n]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict of the fields plus ``chip_states``."""
        return {**asdict(self), "chip_states": self.chip_states()}


@dataclass(frozen=True)
class SliceState:
    """One TPU slice: its shape, its hosts in worker-id order (missing ones included) and health.

    Attributes:
        name: Slice name (label ``ray.io/tpu-slice-name``, GKE's ``TPU_NAME``).
        pod_type: e.g. ``"v6e-16"``.
        version: Ray's accelerator version, e.g. ``"v6e"``.
        topology: e.g. ``"4x4"``.
        shape: The validated :class:`~raytpu_lab.tpu.topology.SliceShape`, or an
            :class:`~raytpu_lab.tpu.unknown.UnknownShape` when the labels name no shape in the
            tables (see :attr:`shape_known`).
        hosts: One :class:`HostState` per worker id ``0 .. shape.num_hosts - 1``.
        health: ``"intact"`` or ``"degraded"`` (always degraded for an unknown shape).
        reasons: Why it is degraded, e.g. ``["worker 2 missing"]``; empty when intact.
        owners: Owners holding chips on the slice, in worker-id order of first appearance.
        head_locked: Worker 0's ``TPU-<pod type>-head`` resource is held (a slice reservation
            holds it, or is being made).
        phase: From Kubernetes: ``"provisioning"`` (hosts still joining), ``"replacing"``
            (KubeRay is deleting and recreating the slice), else ``""``.
        group: The KubeRay worker group, when known from Kubernetes.
    """

    name: str
    pod_type: str
    version: str
    topology: str
    shape: SliceShape | UnknownShape
    hosts: list[HostState]
    health: str
    reasons: list[str]
    owners: list[str]
    head_locked: bool = False
    phase: str = ""
    group: str = ""

    @property
    def shape_known(self) -> bool:
        """The labels name a shape in the topology tables (``shape`` is a ``SliceShape``)."""
        return isinstance(self.shape, SliceShape)

    @property
    def hosts_alive(self) -> int:
        """Hosts whose node is up."""
        return sum(h.alive for h in self.hosts)

    @property
    def hosts_expected(self) -> int:
        """Hosts the topology has."""
        return self.shape.num_hosts

    @property
    def chips_expected(self) -> int:
        """Chips the topology has."""
        return self.shape.num_chips

    @property
    def chips_total(self) -> int:
        """Chips on live hosts."""
        return sum(h.chips for h in self.hosts if h.alive)

    @property
    def chips_free(self) -> int:
        """Chips available now."""
        return sum(h.chips_free for h in self.hosts if h.alive)

    @property
    def chips_reserved(self) -> int:
        """Chips held by placement-group bundles."""
        return sum(h.chips_reserved for h in self.hosts if h.alive)

    @property
    def chips_busy(self) -> int:
        """Chips in use outside any bundle."""
        return sum(h.chips_busy for h in self.hosts if h.alive)

    @property
    def state(self) -> str:
        """One of :data:`SLICE_STATES`.

        ``phase`` when Kubernetes reports one (``"provisioning"`` / ``"replacing"``);
        ``"degraded"`` when health is degraded; ``"reserved"`` when bundles hold every chip;
        ``"free"`` when every chip is free and the head is not locked; ``"busy"`` when no chip is
        free; otherwise ``"partial"`` (also: all chips free but the head locked).
        """
        total = self.chips_total
        if self.phase:
            return self.phase
        if self.health != "intact":
            return "degraded"
        if total and self.chips_reserved == total:
            return "reserved"
        if self.chips_free == total and not self.head_locked:
            return "free"
        if self.chips_free == 0:
            return "busy"
        return "partial"

    @property
    def idle(self) -> bool:
        """Intact, every chip free and the head not locked: a slice reservation can take it."""
        return self.state == "free"

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict: fields (``shape`` as version/topology/chips_per_host) and totals."""
        return {
            "name": self.name, "pod_type": self.pod_type, "version": self.version,
            "topology": self.topology, "shape": asdict(self.shape),
            "shape_known": self.shape_known,
            "hosts": [h.to_dict() for h in self.hosts], "health": self.health,
            "reasons": list(self.reasons), "owners": list(self.owners),
            "head_locked": self.head_locked, "state": self.state, "phase": self.phase,
            "group": self.group,
            "hosts_alive": self.hosts_alive, "hosts_expected": self.hosts_expected,
            "chips_total": self.chips_total, "chips_free": self.chips_free,
            "chips_expected": self.chips_expected,
        }


@dataclass(frozen=True)
class OtherNode:
    """A node that is not a host of any slice (CPU head, CPU workers, odd TPU labels).

    Attributes:
        node_id: Ray node id (hex).
        ip: Node IP address.
        alive: The node is up.
        is_head: It is the Ray head node.
        labels: Its Ray labels.
        resources_total: Its total resources, e.g. ``{"CPU": 2.0}``.
        reason: Why it is not a slice host, e.g. ``"no TPU labels"``.
    """

    node_id: str
    ip: str
    alive: bool
    is_head: bool
    labels: dict[str, str]
    resources_total: dict[str, float]
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict of the fields."""
        return asdict(self)


@dataclass(frozen=True)
class PlannedHost:
    """A host Kubernetes knows about (one pod), for hosts Ray may not show yet.

    Attributes:
        worker_id: Host index in the slice (label ``ray.io/replica-host-index``; 0 on single-host).
        pod: Pod name; ``""`` when KubeRay has not created the pod.
        phase: Pod phase (``Pending``, ``Running``, ``Failed``...), ``""`` without a pod.
        detail: Why it is not up, e.g. ``"Pending: Unschedulable: 0/3 nodes are available"``.
        terminating: The pod is being deleted (``metadata.deletionTimestamp`` set).
    """

    worker_id: int
    pod: str = ""
    phase: str = ""
    detail: str = ""
    terminating: bool = False


@dataclass(frozen=True)
class PlannedSlice:
    """A slice a RayCluster asks for, with what Kubernetes says about its pods.

    Attributes:
        name: Its ``TPU_NAME``, ``<group>-<replica>``.
        group: The worker group.
        version: Ray's accelerator version.
        topology: e.g. ``"4x4"``.
        chips_per_host: ``google.com/tpu`` per pod.
        hosts: What is known per host (any subset of worker ids).
        replacing: KubeRay is deleting and recreating the slice as a unit (a pod of it is
            terminating, failed, or missing while others exist).
    """

    name: str
    group: str
    version: str
    topology: str
    chips_per_host: int
    hosts: tuple[PlannedHost, ...] = ()
    replacing: bool = False


@dataclass(frozen=True)
class ClusterSnapshot:
    """The whole cluster at one moment, as every view draws it.

    Attributes:
        fetched_at: When the raw state was read, seconds since the epoch.
        slices: TPU slices sorted by name.
        other_nodes: Nodes that are no slice host.
        head_node_id: The Ray head node's id, or ``None``.
        pending_owners: Owners of placement groups with bundles not placed on any node yet.
    """

    fetched_at: float
    slices: list[SliceState]
    other_nodes: list[OtherNode]
    head_node_id: str | None
    pending_owners: list[str] = field(default_factory=list)

    def slice(self, name: str) -> SliceState:
        """The slice called ``name``.

        Raises:
            KeyError: No such slice (the message lists the known ones).
        """
        for s in self.slices:
            if s.name == name:
                return s
        raise KeyError(f"no slice {name!r}; slices: {[s.name for s in self.slices]}")

    def slices_of(self, pod_type: str) -> list[SliceState]:
        """Slices of a pod type, e.g. ``"v6e-16"`` (GKE's ``"tpu7x-8"`` matches ``"v7x-8"``)."""
        want = _pod_key(pod_type)
        return [s for s in self.slices if _pod_key(s.pod_type) == want]

    def idle_slices(self, pod_type: str | None = None) -> list[SliceState]:
        """Intact slices with every chip free and the head not locked, optionally of a pod type."""
        pool = self.slices if pod_type is None else self.slices_of(pod_type)
        return [s for s in pool if s.idle]

    @property
    def total_chips(self) -> int:
        """Chips on live hosts of all slices."""
        return sum(s.chips_total for s in self.slices)

    @property
    def free_chips(self) -> int:
        """Chips available now on all slices."""
        return sum(s.chips_free for s in self.slices)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict of the snapshot (what a front end receives)."""
        return {
            "fetched_at": self.fetched_at, "head_node_id": self.head_node_id,
            "slices": [s.to_dict() for s in self.slices],
            "other_nodes": [n.to_dict() for n in self.other_nodes],
            "pending_owners": list(self.pending_owners),
            "total_chips": self.total_chips, "free_chips": self.free_chips,
        }


@functools.lru_cache(maxsize=4096)
def _pod_key(pod_type: str) -> tuple[str, int] | str:
    try:
        return split_pod_type(pod_type)
    except InvalidTopologyError:
        return pod_type


@functools.lru_cache(maxsize=4096)
def _cached_shape(version: str, topology: str, chips_per_host: int = 0
                  ) -> SliceShape | InvalidTopologyError:
    """:class:`SliceShape` (frozen, so shared) or the error; cached: a pod has thousands of
    hosts of a handful of shapes, and validating each one dominated :func:`build_snapshot`."""
    try:
        return SliceShape(version, topology, chips_per_host)
    except InvalidTopologyError as err:
        return err


def _shape(version: str, topology: str, chips_per_host: int = 0) -> SliceShape:
    shape = _cached_shape(version, topology, chips_per_host)
    if isinstance(shape, InvalidTopologyError):  # rare: raise a fresh error, not the cached one
        return SliceShape(version, topology, chips_per_host)
    return shape


@functools.lru_cache(maxsize=4096)
def _labelled_shape(pod: str | None, accel: str | None, topology: str
                    ) -> SliceShape | InvalidTopologyError:
    try:
        version = split_pod_type(pod)[0] if pod else normalize_version(accel or "")
    except InvalidTopologyError as err:
        return err
    return _cached_shape(version, topology)


def _chips(amount: Any) -> int:
    """Whole chips in a resource amount (a partly used chip is not free)."""
    try:
        return max(0, math.floor(float(amount) + 1e-9))
    except (TypeError, ValueError):
        return 0


@dataclass
class _Tpu:
    """A node's parsed TPU labels; ``shape`` is ``None`` when they name no known shape."""

    node: Mapping[str, Any]
    slice_name: str
    worker_id: int
    shape: SliceShape | None
    labels: tuple[str, str, str] = ("", "", "")  # pod type, accelerator type, topology

    @property
    def key(self) -> tuple[str, ...]:
        """What the node says the slice is: ``(version, topology)``, or its raw labels."""
        shape = self.shape
        return (shape.version, shape.topology) if shape is not None else ("?", *self.labels)

    @property
    def spec(self) -> str:
        shape = self.shape
        if shape is not None:
            return shape.spec
        pod, accel, topology = self.labels
        return f"{pod or accel or '?'}:{topology or '?'}"


def _read_labels(node: Mapping[str, Any]) -> _Tpu | str:
    """Parse a node's TPU labels; return the reason it is no slice host when they do not fit."""
    labels = node.get("labels") or {}
    if not any(labels.get(k) for k in _TPU_LABELS):
        tpu = _chips((node.get("resources_total") or {}).get("TPU", 0))
        return f"TPU resource ({tpu}) but no TPU labels" if tpu else "no TPU labels"
    name, worker = labels.get(LABEL_SLICE), str(labels.get(LABEL_WORKER, "")).strip()
    pod, topology = labels.get(LABEL_POD_TYPE), labels.get(LABEL_TOPOLOGY)
    accel = labels.get(LABEL_ACCELERATOR)
    if not name:
        return "TPU labels but no slice name"
    if not worker.isdecimal():
        return f"slice {name!r} but no usable worker id ({worker or 'none'})"
    shape = _labelled_shape(pod, accel, topology) if topology else None
    if not isinstance(shape, SliceShape):  # unknown shape: still a host of its slice
        return _Tpu(node, name, int(worker), None, (pod or "", accel or "", topology or ""))
    return _Tpu(node, name, int(worker), shape)


def _owner_name(pg: Mapping[str, Any], reservations: Mapping[str, str]) -> str:
    pg_id = str(pg.get("placement_group_id", ""))
    if pg_id in reservations:
        return reservations[pg_id]
    name = str(pg.get("name") or "")
    if name.startswith(RESERVATION_PREFIX):
        return name[len(RESERVATION_PREFIX):]
    return f"placement group {pg_id[:8]}"


def _bundles_by_node(groups: Iterable[Mapping[str, Any]], reservations: Mapping[str, str]
                     ) -> tuple[dict[str, Counter[str]], set[str], list[str]]:
    """``({node id: Counter(owner -> chips)}, {node ids with a head-lock bundle}, pending owners)``."""
    held: dict[str, Counter[str]] = defaultdict(Counter)
    head_locked: set[str] = set()
    pending: list[str] = []
    for pg in groups:
        owner = _owner_name(pg, reservations)
        for bundle in pg.get("bundles") or []:
            node_id, res = bundle.get("node_id"), bundle.get("resources") or {}
            if not node_id:
                if owner not in pending:
                    pending.append(owner)
                continue
            if any(k.startswith("TPU-") and k.endswith("-head") for k in res):
                head_locked.add(node_id)
            tpu = float(res.get("TPU", 0) or 0)
            if tpu > 0:
                held[node_id][owner] += math.ceil(tpu - 1e-9)
    return held, head_locked, pending


_NO_BUNDLES: Counter[str] = Counter()  # shared, never modified: hosts without bundles


def _host(tpu: _Tpu, cph: int, held: Counter[str], jobs: frozenset[str] = frozenset()) -> HostState:
    # Positional HostState fields (worker_id, node_id, ip, state, chips, chips_free, owner,
    # labels, chips_reserved, chips_busy, chips_per_host): called once per host per refresh.
    node = tpu.node
    labels = dict(node.get("labels") or {})
    total = _chips((node.get("resources_total") or {}).get("TPU", 0))
    node_id, ip = node.get("node_id"), str(node.get("ip", ""))
    owner = held.most_common(1)[0][0] if held else None
    if not node.get("alive"):
        return HostState(tpu.worker_id, node_id, ip, "dead", total, 0, owner, labels, 0, 0, cph)
    available = _chips((node.get("resources_available") or {}).get("TPU", 0))  # absent: 0
    in_jobs = min(sum(n for o, n in held.items() if o in jobs), total) if jobs and held else 0
    reserved = min(sum(held.values()), total) - in_jobs if held else 0
    free = max(0, min(available, total - reserved - in_jobs))
    busy = total - reserved - free
    state = "reserved" if reserved else "busy" if busy else "free"
    return HostState(tpu.worker_id, node_id, ip, state, total, free, owner, labels, reserved,
                     busy, cph)


def _known_shape(members: list[_Tpu], version: str, topology: str, expected: int | None,
                 reasons: list[str]) -> SliceShape:
    """The slice's table shape (most members' labels); label disagreements go to ``reasons``."""
    shape = _shape(version, topology)
    if expected and expected != shape.num_hosts:
        with contextlib.suppress(InvalidTopologyError):  # keep Ray's rule if it cannot tile
            shape = _shape(version, topology, shape.num_chips // expected)
        if shape.num_hosts != expected:
            reasons.append(f"expected {expected} hosts, {topology} has {shape.num_hosts}")
    want_pod = _pod_key(shape.pod_type)  # hoisted: per host is slow
    for m in members:
        m_labels = m.node.get("labels") or {}
        if m.shape is not shape and m.key != (version, topology):
            reasons.append(f"labels inconsistent: worker {m.worker_id} says {m.spec}, "
                           f"slice is {shape.spec}")
        pod = m_labels.get(LABEL_POD_TYPE)
        if pod and _pod_key(pod) != want_pod:
            reasons.append(f"labels inconsistent: worker {m.worker_id} pod type {pod}, "
                           f"topology {topology} is {shape.pod_type}")
    return shape


def _unknown_slice_shape(members: list[_Tpu], key: tuple[str, ...], expected: int | None,
                         reasons: list[str]) -> UnknownShape:
    """An :class:`UnknownShape` from the members' labels and ``TPU`` resources."""
    pod, accel, topology = key[1:]
    cph = max(_chips((m.node.get("resources_total") or {}).get("TPU", 0)) for m in members)
    seen = max(m.worker_id for m in members) + 1
    shape, notes = unknown_shape(pod, accel, topology, chips_per_host=cph, hosts_seen=seen,
                                 num_hosts=min(expected, MAX_UNKNOWN_HOSTS) if expected else None)
    reasons.append(f"unknown TPU shape {shape.spec}: drawn from Ray's labels and resources")
    reasons.extend(notes)
    for m in members:
        if m.key != key:
            reasons.append(f"labels inconsistent: worker {m.worker_id} says {m.spec}, "
                           f"slice is {shape.spec}")
    return shape


def _build_slice(name: str, members: list[_Tpu], expected: int | None,
                 held: Mapping[str, Counter[str]], locked: set[str],
                 other: list[OtherNode], jobs: frozenset[str] = frozenset()) -> SliceState:
    """One slice from the nodes claiming it; extra nodes go to ``other``."""
    reasons: list[str] = []
    key, _ = Counter(m.key for m in members).most_common(1)[0]
    shape: SliceShape | UnknownShape
    if key[0] == "?":
        shape = _unknown_slice_shape(members, key, expected, reasons)
    else:
        shape = _known_shape(members, key[0], key[1], expected, reasons)
    num_hosts = shape.num_hosts
    by_worker: dict[int, list[_Tpu]] = defaultdict(list)
    for m in members:
        if m.worker_id < num_hosts:
            by_worker[m.worker_id].append(m)
        else:
            reasons.append(f"labels inconsistent: worker {m.worker_id} outside "
                           f"{num_hosts} hosts")
            other.append(_other(m.node, f"worker {m.worker_id} outside slice {name!r}"))
    hosts: list[HostState] = []
    kept: dict[int, Mapping[str, Any]] = {}
    for wid in range(num_hosts):
        claims = by_worker.get(wid, [])
        if len(claims) > 1:
            claims = sorted(claims, key=lambda m: not m.node.get("alive"))
        if not claims:
            hosts.append(HostState(wid, None, "", "missing", 0, 0, None,
                                   chips_per_host=shape.chips_per_host))
            reasons.append("no worker 0" if wid == 0 else f"worker {wid} missing")
            continue
        keep, *extra = claims
        kept[wid] = keep.node
        for m in extra:
            if m.node.get("alive"):
                reasons.append(f"labels inconsistent: worker {wid} claimed by several live nodes")
            other.append(_other(m.node, f"duplicate worker {wid} of slice {name!r}"))
        host = _host(keep, shape.chips_per_host, held.get(keep.node.get("node_id", ""), _NO_BUNDLES),
                     jobs)
        hosts.append(host)
        if host.state == "dead":
            reasons.append(f"worker {wid} dead")
        elif host.chips < shape.chips_per_host:
            reasons.append(f"chip count short on worker {wid} ({host.chips} of "
                           f"{shape.chips_per_host})")
        elif host.chips > shape.chips_per_host:
            reasons.append(f"chip count over on worker {wid} ({host.chips} of "
                           f"{shape.chips_per_host})")
    head = hosts[0]
    head_locked = head.node_id in locked
    if head.alive and shape.head_resource:  # an unknown shape without a pod type has none
        node = kept[0]
        total = node.get("resources_total") or {}
        if not total.get(shape.head_resource):
            reasons.append(f"worker 0 has no {shape.head_resource} resource")
        elif not (node.get("resources_available") or {}).get(shape.head_resource):
            head_locked = True
    owners = list(dict.fromkeys(
        o for h in hosts if h.alive for o in held.get(h.node_id or "", _NO_BUNDLES)))
    return SliceState(name=name, pod_type=shape.pod_type or "unknown", version=shape.version,
                      topology=shape.topology or "unknown", shape=shape, hosts=hosts,
                      health="degraded" if reasons else "intact",
                      reasons=list(dict.fromkeys(reasons)), owners=owners,
                      head_locked=head_locked)


def _other(node: Mapping[str, Any], reason: str) -> OtherNode:
    return OtherNode(node_id=str(node.get("node_id", "")), ip=str(node.get("ip", "")),
                     alive=bool(node.get("alive")), is_head=bool(node.get("is_head")),
                     labels=dict(node.get("labels") or {}),
                     resources_total=dict(node.get("resources_total") or {}), reason=reason)


def build_snapshot(raw: Mapping[str, Any], *, reservations: Mapping[str, str] | None = None,
                   expected_hosts: Mapping[str, int] | None = None,
                   jobs: Mapping[str, str] | None = None,
                   planned: Iterable[PlannedSlice] | None = None) -> ClusterSnapshot:
    """Turn raw Ray state into slices, hosts and chips.

    Args:
        raw: The raw state of :func:`raytpu_lab.state.fetch.fetch_raw_state` (or a recording).
        reservations: ``{placement group id: reservation name}`` from our registry. Groups named
            ``"raytpu:<name>"`` count as reservation ``<name>`` without it.
        expected_hosts: ``{slice name: hosts it should have}``, when known (the emulator knows);
            sets chips per host when Ray's rule disagrees. A slice with no node at all is not
            listed (its shape is unknown).
        jobs: ``{placement group id: run label}`` of running jobs (e.g. a JaxTrainer run this
            session launched, ``"run digits"``): their chips count as ``busy`` with that owner
            rather than ``reserved``.
        planned: Slices Kubernetes expects (a RayCluster's worker groups and pods): hosts not in
            Ray become ``"provisioning"``, absent slices are listed, replaced ones get phase
            ``"replacing"``. ``None`` (no Kubernetes) changes nothing.

    Returns:
        The :class:`ClusterSnapshot`. Never raises on odd labels: such nodes land in
        ``other_nodes`` with a reason, and their slice is marked degraded.
    """
    reservations = {**(reservations or {}), **(jobs or {})}
    expected_hosts = expected_hosts or {}
    held, locked, pending = _bundles_by_node(raw.get("placement_groups") or [], reservations)
    other: list[OtherNode] = []
    by_slice: dict[str, list[_Tpu]] = defaultdict(list)
    head_node_id = None
    for node in raw.get("nodes") or []:
        if node.get("is_head") and (head_node_id is None or node.get("alive")):
            head_node_id = node.get("node_id")
        parsed = _read_labels(node)
        if isinstance(parsed, str):
            other.append(_other(node, parsed))
        else:
            by_slice[parsed.slice_name].append(parsed)
    job_owners = frozenset(jobs.values()) if jobs else frozenset()
    slices = [_build_slice(name, by_slice[name], expected_hosts.get(name), held, locked, other,
                           job_owners) for name in sorted(by_slice)]
    if planned is not None:
        slices = _apply_plan(slices, planned)
    return ClusterSnapshot(fetched_at=float(raw.get("fetched_at") or 0.0), slices=slices,
                           other_nodes=other, head_node_id=head_node_id, pending_owners=pending)


def _planned_detail(host: PlannedHost | None) -> str:
    if host is None or not host.pod:
        return "pod not created yet"
    if host.terminating:
        return f"pod {host.pod} terminating"
    return f"pod {host.pod} {host.detail or host.phase or 'starting'}"


def _with_plan(s: SliceState, plan: PlannedSlice) -> SliceState:
    by_worker = {h.worker_id: h for h in plan.hosts}
    hosts, reasons = [], [r for r in s.reasons
                          if not (r == "no worker 0" or (r.startswith("worker ") and r.endswith(" missing")))]
    waiting = 0
    for h in s.hosts:
        info = by_worker.get(h.worker_id)
        if h.state == "missing":
            detail = _planned_detail(info)
            h = dataclasses.replace(h, state="provisioning", detail=detail)
            reasons.append(f"worker {h.worker_id} provisioning ({detail})")
            waiting += 1
        elif info is not None and (info.terminating or info.phase == "Failed"):
            h = dataclasses.replace(h, detail=_planned_detail(info))
        hosts.append(h)
    phase = "replacing" if plan.replacing else "provisioning" if waiting else ""
    if plan.replacing:
        reasons.insert(0, "KubeRay is replacing the slice (its pods are recreated as a unit)")
    return dataclasses.replace(s, hosts=hosts, reasons=list(dict.fromkeys(reasons)), phase=phase,
                               group=plan.group, health="degraded" if reasons else s.health)


def _absent_slice(plan: PlannedSlice) -> SliceState | None:
    shape = _cached_shape(plan.version, plan.topology, plan.chips_per_host)
    if isinstance(shape, InvalidTopologyError):
        return None
    by_worker = {h.worker_id: h for h in plan.hosts}
    hosts = [HostState(w, None, "", "provisioning", 0, 0, None, chips_per_host=shape.chips_per_host,
                       detail=_planned_detail(by_worker.get(w))) for w in range(shape.num_hosts)]
    pods = sum(1 for h in plan.hosts if h.pod)
    reasons = [f"none of {shape.num_hosts} host(s) joined Ray yet ({pods} pod(s) created)"]
    reasons += [f"worker {h.worker_id}: {h.detail}" for h in hosts if h.detail != "pod not created yet"]
    if plan.replacing:
        reasons.insert(0, "KubeRay is replacing the slice (its pods are recreated as a unit)")
    return SliceState(name=plan.name, pod_type=shape.pod_type, version=shape.version,
                      topology=shape.topology, shape=shape, hosts=hosts, health="degraded",
                      reasons=reasons, owners=[], phase="replacing" if plan.replacing else "provisioning",
                      group=plan.group)


def _apply_plan(slices: list[SliceState], planned: Iterable[PlannedSlice]) -> list[SliceState]:
    """Merge what Kubernetes expects into the slices Ray shows (see :func:`build_snapshot`)."""
    by_name = {s.name: s for s in slices}
    for plan in planned:
        if plan.name in by_name:
            by_name[plan.name] = _with_plan(by_name[plan.name], plan)
        else:
            absent = _absent_slice(plan)
            if absent is not None:
                by_name[plan.name] = absent
    return [by_name[n] for n in sorted(by_name)]
