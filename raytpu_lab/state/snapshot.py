"""The cluster at one moment, as every view draws it: slices, hosts and their states; pure.

:func:`raytpu_lab.state.model.build_snapshot` makes these frozen records from Ray's raw state
(that module says how chips are counted); views, reservations and runs only read them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal, get_args

from raytpu_lab._protocols import HostDict, OtherNodeDict, SliceDict, SnapshotDict
from raytpu_lab.state._shapes import pod_key
from raytpu_lab.tpu.topology import SliceShape
from raytpu_lab.tpu.unknown import UnknownShape

__all__ = ["HOST_STATES", "SLICE_STATES", "HostStateName", "SliceStateName", "SlicePhase",
           "HostState", "SliceState", "OtherNode", "ClusterSnapshot", "CHIP_LETTERS"]

HostStateName = Literal["free", "reserved", "busy", "dead", "missing", "provisioning"]
SlicePhase = Literal["", "provisioning", "replacing"]
"""What Kubernetes says of a slice: ``""`` (nothing), hosts still joining, or being recreated."""
SliceStateName = Literal["free", "reserved", "busy", "partial", "degraded", "provisioning",
                         "replacing"]
HOST_STATES: tuple[HostStateName, ...] = get_args(HostStateName)
"""Host states in the order the map's rows index them (``code``)."""
SLICE_STATES: tuple[SliceStateName, ...] = get_args(SliceStateName)


CHIP_LETTERS: dict[str, str] = {"r": "reserved", "b": "busy", "f": "free"}
"""The letters of :attr:`HostState.chip_layout`."""


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
        chip_layout: Each chip's state by Ray chip id, one letter per chip (``"r"`` reserved,
            ``"b"`` busy, ``"f"`` free), when the raylet named the chips in use; ``""`` when
            it did not (chips are then drawn by count: reserved, busy, free).
        chip_holders: Who holds each chip, by Ray chip id (``""`` for none known), e.g.
            ``("Holder 'a' (job 01000000, pid 8090)", "", ...)``; ``()`` when none is known.
            A bundle's chips that no process uses yet have no id in Ray; they are drawn at the
            lowest ids no process holds.
    """

    worker_id: int
    node_id: str | None
    ip: str
    state: HostStateName
    chips: int
    chips_free: int
    owner: str | None
    labels: dict[str, str] = field(default_factory=dict)
    chips_reserved: int = 0
    chips_busy: int = 0
    chips_per_host: int = 0
    detail: str = ""
    chip_layout: str = ""
    chip_holders: tuple[str, ...] = ()

    @property
    def alive(self) -> bool:
        """The node is up (neither dead, missing nor provisioning)."""
        return self.state not in ("dead", "missing", "provisioning")

    def chip_states(self) -> list[str]:
        """Per-chip states by Ray chip id, ``chips_per_host`` long: :attr:`chip_layout` when
        known, else reserved, then busy, then free chips.

        A dead or missing host's chips are all ``"dead"`` / ``"missing"``; chips the topology
        expects but the node lacks are ``"missing"``.
        """
        n = self.chips_per_host or self.chips
        if not self.alive:
            return [self.state] * n
        if self.chip_layout:
            states = [CHIP_LETTERS[c] for c in self.chip_layout]
        else:
            states = (["reserved"] * self.chips_reserved + ["busy"] * self.chips_busy
                      + ["free"] * self.chips_free)
        return (states + ["missing"] * n)[:n]

    def to_dict(self) -> HostDict:
        """JSON-able dict of the fields plus ``chip_states``."""
        return HostDict(worker_id=self.worker_id, node_id=self.node_id, ip=self.ip,
                        state=self.state, chips=self.chips, chips_free=self.chips_free,
                        owner=self.owner, labels=dict(self.labels),
                        chips_reserved=self.chips_reserved, chips_busy=self.chips_busy,
                        chips_per_host=self.chips_per_host, detail=self.detail,
                        chip_states=self.chip_states(), chip_holders=list(self.chip_holders))



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
        chips_total: Chips on live hosts (derived from ``hosts``, as the three below).
        chips_free: Chips available now.
        chips_reserved: Chips held by placement-group bundles.
        chips_busy: Chips in use outside any bundle.
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
    phase: SlicePhase = ""
    group: str = ""
    # Totals over live hosts, counted once in __post_init__: state and every view read them on
    # each refresh (dataclasses.replace recounts them for the new hosts).
    chips_total: int = field(init=False, repr=False, compare=False)
    chips_free: int = field(init=False, repr=False, compare=False)
    chips_reserved: int = field(init=False, repr=False, compare=False)
    chips_busy: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        total = free = reserved = busy = 0
        for h in self.hosts:
            if h.alive:
                total += h.chips
                free += h.chips_free
                reserved += h.chips_reserved
                busy += h.chips_busy
        for name, value in (("chips_total", total), ("chips_free", free),
                            ("chips_reserved", reserved), ("chips_busy", busy)):
            object.__setattr__(self, name, value)

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
    def state(self) -> SliceStateName:
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

    def to_dict(self) -> SliceDict:
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

    def to_dict(self) -> OtherNodeDict:
        """JSON-able dict of the fields."""
        return OtherNodeDict(node_id=self.node_id, ip=self.ip, alive=self.alive,
                             is_head=self.is_head, labels=dict(self.labels),
                             resources_total=dict(self.resources_total), reason=self.reason)



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
        want = pod_key(pod_type)
        return [s for s in self.slices if pod_key(s.pod_type) == want]

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

    def to_dict(self) -> SnapshotDict:
        """JSON-able dict of the snapshot (what a front end receives)."""
        return {
            "fetched_at": self.fetched_at, "head_node_id": self.head_node_id,
            "slices": [s.to_dict() for s in self.slices],
            "other_nodes": [n.to_dict() for n in self.other_nodes],
            "pending_owners": list(self.pending_owners),
            "total_chips": self.total_chips, "free_chips": self.free_chips,
        }

