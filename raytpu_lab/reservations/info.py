"""Pure: the raytpu reservations on a cluster, and the host order of one, from raw Ray state.

A reservation ``<name>`` is the placement group named ``"raytpu:<name>"`` (one bundle per host of
its slices) plus one head lock per slice named ``"raytpu:<name>:head:<slice>"`` (see
:mod:`raytpu_lab.reservations.slices`). Any driver can read them from the placement-group table, so a kernel
lists, attaches and releases reservations another kernel made. No Ray, no I/O: input is the raw
state of :func:`raytpu_lab.state.fetch.fetch_raw_state` (plus, optionally, lifetimes from
:func:`~raytpu_lab.state.fetch.fetch_placement_group_lifetimes`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from raytpu_lab.tpu.labels import (
    LABEL_POD_TYPE,
    LABEL_SLICE,
    LABEL_TOPOLOGY,
    LABEL_WORKER,
    RESERVATION_PREFIX,
)

__all__ = ["HEAD_LOCK_INFIX", "ReservationInfo", "HostSlot", "list_reservations", "host_order",
           "reservation_group_name", "head_lock_name"]

_PREFIX = RESERVATION_PREFIX
HEAD_LOCK_INFIX = ":head:"
"""Head locks are named ``raytpu:<name>:head:<slice>``."""


def reservation_group_name(name: str) -> str:
    """``"raytpu:<name>"``: the placement group holding every host of reservation ``name``."""
    return f"{_PREFIX}{name}"


def head_lock_name(name: str, slice_name: str) -> str:
    """``"raytpu:<name>:head:<slice>"``: the head lock of one slice of reservation ``name``."""
    return f"{_PREFIX}{name}{HEAD_LOCK_INFIX}{slice_name}"


@dataclass(frozen=True)
class HostSlot:
    """One bundle of a reservation's placement group and the host it sits on.

    Attributes:
        bundle_index: Index of the bundle in the placement group.
        slice_name: The host's slice.
        worker_id: The host's worker id in its slice (0 is the head).
        node_id: Ray node id (hex).
        ip: Node IP address.
    """

    bundle_index: int
    slice_name: str
    worker_id: int
    node_id: str
    ip: str


@dataclass(frozen=True)
class ReservationInfo:
    """A raytpu reservation as the cluster shows it (whoever made it).

    Attributes:
        name: Reservation name.
        placement_group_id: Id (hex) of ``raytpu:<name>``.
        state: Ray's placement-group state: ``"CREATED"`` (every bundle placed), ``"PENDING"``,
            ``"RESCHEDULING"`` (a host died).
        slice_names: Slices its bundles sit on, in bundle order.
        pod_type: e.g. ``"v4-16"`` (from the hosts' labels; ``""`` when no bundle is placed).
        topology: e.g. ``"2x2x2"``.
        num_hosts: Bundles (one per host).
        chips: TPU chips its bundles hold, all together.
        head_locks: ``{slice name: head-lock placement group id}``.
        detached: Whether it outlives the driver that made it; ``None`` if unknown.
        creator_job_id: The Ray job (driver) that made it; ``""`` if unknown.
    """

    name: str
    placement_group_id: str
    state: str
    slice_names: list[str]
    pod_type: str
    topology: str
    num_hosts: int
    chips: int
    head_locks: dict[str, str] = field(default_factory=dict)
    detached: bool | None = None
    creator_job_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict of the fields."""
        return {k: (list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v)
                for k, v in self.__dict__.items()}


def list_reservations(raw: Mapping[str, Any],
                      lifetimes: Mapping[str, Mapping[str, Any]] | None = None,
                      ) -> list[ReservationInfo]:
    """Every raytpu reservation in ``raw``, sorted by name.

    Args:
        raw: Raw state (``nodes`` with labels, ``placement_groups`` with bundles).
        lifetimes: ``{placement group id: {"is_detached": bool, "creator_job_id": str}}``.

    Returns:
        One :class:`ReservationInfo` per placement group named ``raytpu:<name>`` (head locks are
        attached to their reservation, not listed on their own).
    """
    lifetimes = lifetimes or {}
    nodes = {n.get("node_id"): n for n in raw.get("nodes") or []}
    groups = [g for g in raw.get("placement_groups") or []
              if str(g.get("name") or "").startswith(_PREFIX)]
    locks: dict[str, dict[str, str]] = {}
    for g in groups:
        name = str(g["name"])[len(_PREFIX):]
        if HEAD_LOCK_INFIX in name:
            owner, _, slice_name = name.partition(HEAD_LOCK_INFIX)
            locks.setdefault(owner, {})[slice_name] = str(g.get("placement_group_id", ""))
    found = []
    for g in groups:
        name = str(g["name"])[len(_PREFIX):]
        if HEAD_LOCK_INFIX in name:
            continue
        pg_id = str(g.get("placement_group_id", ""))
        slices: list[str] = []
        pod_type = topology = ""
        chips = 0
        bundles = g.get("bundles") or []
        for b in sorted(bundles, key=lambda b: int(b.get("index", 0))):
            chips += int(float((b.get("resources") or {}).get("TPU", 0) or 0))
            labels = (nodes.get(b.get("node_id")) or {}).get("labels") or {}
            if labels.get(LABEL_SLICE) and labels[LABEL_SLICE] not in slices:
                slices.append(labels[LABEL_SLICE])
            pod_type = pod_type or labels.get(LABEL_POD_TYPE, "")
            topology = topology or labels.get(LABEL_TOPOLOGY, "")
        life = lifetimes.get(pg_id) or {}
        detached = life.get("is_detached")
        found.append(ReservationInfo(
            name=name, placement_group_id=pg_id, state=str(g.get("state", "")), slice_names=slices,
            pod_type=pod_type, topology=topology, num_hosts=len(bundles), chips=chips,
            head_locks=dict(locks.get(name, {})),
            detached=None if detached is None else bool(detached),
            creator_job_id=str(life.get("creator_job_id", ""))))
    return sorted(found, key=lambda r: r.name)


def host_order(raw: Mapping[str, Any], placement_group_id: str,
               slice_names: list[str]) -> list[HostSlot]:
    """The bundles of a placement group in SPMD order: by slice (as listed), then worker id.

    Ray places bundle ``i`` of a slice reservation on any host of its slice; JAX wants process
    ``k`` on worker ``k`` (worker 0, the head, hosts the coordinator), so the order comes from
    the hosts' ``ray.io/tpu-worker-id`` labels.

    Raises:
        ValueError: The group is unknown, has unplaced bundles, or sits on a host without TPU
            labels (the message says which).
    """
    group = next((g for g in raw.get("placement_groups") or []
                  if g.get("placement_group_id") == placement_group_id), None)
    if group is None:
        raise ValueError(f"placement group {placement_group_id[:8]} is not in the cluster state")
    nodes = {n.get("node_id"): n for n in raw.get("nodes") or []}
    slots = []
    for b in group.get("bundles") or []:
        node = nodes.get(b.get("node_id"))
        if node is None:
            raise ValueError(f"bundle {b.get('index')} of placement group "
                             f"{placement_group_id[:8]} is not placed on a live host")
        labels = node.get("labels") or {}
        worker = str(labels.get(LABEL_WORKER, ""))
        if not labels.get(LABEL_SLICE) or not worker.isdecimal():
            raise ValueError(f"bundle {b.get('index')} sits on node {str(node.get('node_id'))[:8]}, "
                             "which has no TPU slice / worker id labels")
        slots.append(HostSlot(int(b.get("index", 0)), labels[LABEL_SLICE], int(worker),
                              str(node.get("node_id")), str(node.get("ip", ""))))
    rank = {s: i for i, s in enumerate(slice_names)}
    return sorted(slots, key=lambda s: (rank.get(s.slice_name, len(rank)), s.slice_name, s.worker_id))
