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

Which chip is whose: where the raw state names the processes holding a node's chips (Ray's chip
ids, from its raylet), each chip is drawn at its id and named by its holder; see
:mod:`raytpu_lab.state.chips`.

On Kubernetes, ``planned`` slices (:class:`~raytpu_lab.state.planned.PlannedSlice`) add what Ray
cannot know; see :mod:`raytpu_lab.state.planned`. The records themselves live in
:mod:`raytpu_lab.state.snapshot`, re-exported here.
"""

from __future__ import annotations

import contextlib
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from raytpu_lab._protocols import RawNode, RawPlacementGroup, RawState
from raytpu_lab.errors import InvalidTopologyError
from raytpu_lab.state._shapes import labelled_shape, pod_key, table_shape, whole_chips
from raytpu_lab.state.chips import place_chips
from raytpu_lab.state.planned import PlannedHost, PlannedSlice, apply_plan
from raytpu_lab.state.snapshot import (
    HOST_STATES,
    SLICE_STATES,
    ClusterSnapshot,
    HostState,
    HostStateName,
    OtherNode,
    SliceState,
)
from raytpu_lab.tpu.labels import (
    LABEL_ACCELERATOR,
    LABEL_POD_TYPE,
    LABEL_SLICE,
    LABEL_TOPOLOGY,
    LABEL_WORKER,
    RESERVATION_PREFIX,
    TPU_LABELS,
)
from raytpu_lab.tpu.topology import SliceShape
from raytpu_lab.tpu.unknown import MAX_UNKNOWN_HOSTS, UnknownShape, unknown_shape

# The records and label names are re-exported: code outside the state package imports them from
# here (raytpu_lab.state.model was one module before it was split).
__all__ = [
    "ClusterSnapshot",
    "HOST_STATES",
    "HostState",
    "LABEL_ACCELERATOR",
    "LABEL_POD_TYPE",
    "LABEL_SLICE",
    "LABEL_TOPOLOGY",
    "LABEL_WORKER",
    "OtherNode",
    "PlannedHost",
    "PlannedSlice",
    "RESERVATION_PREFIX",
    "SLICE_STATES",
    "SliceState",
    "build_snapshot",
]


@dataclass
class _Tpu:
    """A node's parsed TPU labels; ``shape`` is ``None`` when they name no known shape."""

    node: RawNode
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


def _read_labels(node: RawNode) -> _Tpu | str:
    """Parse a node's TPU labels; return the reason it is no slice host when they do not fit."""
    labels = node.get("labels") or {}
    if not any(labels.get(k) for k in TPU_LABELS):
        tpu = whole_chips((node.get("resources_total") or {}).get("TPU", 0))
        return f"TPU resource ({tpu}) but no TPU labels" if tpu else "no TPU labels"
    name, worker = labels.get(LABEL_SLICE), str(labels.get(LABEL_WORKER, "")).strip()
    pod, topology = labels.get(LABEL_POD_TYPE), labels.get(LABEL_TOPOLOGY)
    accel = labels.get(LABEL_ACCELERATOR)
    if not name:
        return "TPU labels but no slice name"
    if not worker.isdecimal():
        return f"slice {name!r} but no usable worker id ({worker or 'none'})"
    shape = labelled_shape(pod, accel, topology) if topology else None
    if not isinstance(shape, SliceShape):  # unknown shape: still a host of its slice
        return _Tpu(node, name, int(worker), None, (pod or "", accel or "", topology or ""))
    return _Tpu(node, name, int(worker), shape)


def _owner_name(pg: RawPlacementGroup, reservations: Mapping[str, str]) -> str:
    pg_id = str(pg.get("placement_group_id", ""))
    if pg_id in reservations:
        return reservations[pg_id]
    name = str(pg.get("name") or "")
    if name.startswith(RESERVATION_PREFIX):
        return name[len(RESERVATION_PREFIX):]
    # Any Serve replica's group, whoever deployed it: named as the replica by Serve, or made by
    # the replica itself (Ray Serve LLM reserves its own TPU slice from inside the replica).
    for named in (name, str(pg.get("creator") or "")):
        if named.startswith(SERVE_REPLICA_PREFIX):
            app, _, rest = named[len(SERVE_REPLICA_PREFIX):].partition("#")
            deployment = rest.partition("#")[0]
            return f"serve: {app}/{deployment}" if deployment else f"serve: {app}"
    return f"placement group {pg_id[:8]}"


SERVE_REPLICA_PREFIX = "SERVE_REPLICA::"
"""Ray Serve 2.60 names a replica's placement group as the replica actor:
``SERVE_REPLICA::<app>#<deployment>#<id>`` (``ray.serve._private.common.ReplicaID.to_full_id_str``)."""


def _bundles_by_node(groups: Iterable[RawPlacementGroup], reservations: Mapping[str, str]
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


def _host(tpu: _Tpu, cph: int, held: Counter[str], jobs: frozenset[str] = frozenset(),
          owners: Mapping[str, str] | None = None) -> HostState:
    # Positional HostState fields (worker_id, node_id, ip, state, chips, chips_free, owner,
    # labels, chips_reserved, chips_busy, chips_per_host): called once per host per refresh.
    node = tpu.node
    labels = dict(node.get("labels") or {})
    total = whole_chips((node.get("resources_total") or {}).get("TPU", 0))
    node_id, ip = node.get("node_id"), str(node.get("ip", ""))
    owner = held.most_common(1)[0][0] if held else None
    if not node.get("alive"):
        return HostState(tpu.worker_id, node_id, ip, "dead", total, 0, owner, labels, 0, 0, cph)
    available = whole_chips((node.get("resources_available") or {}).get("TPU", 0))  # absent: 0
    in_jobs = min(sum(n for o, n in held.items() if o in jobs), total) if jobs and held else 0
    reserved = min(sum(held.values()), total) - in_jobs if held else 0
    free = max(0, min(available, total - reserved - in_jobs))
    busy = total - reserved - free
    state: HostStateName = "reserved" if reserved else "busy" if busy else "free"
    holders = node.get("chip_holders")
    layout, who = place_chips(total, reserved, busy, holders, owners or {}, jobs) \
        if holders else ("", ())
    return HostState(tpu.worker_id, node_id, ip, state, total, free, owner, labels, reserved,
                     busy, cph, chip_layout=layout, chip_holders=who)


def _known_shape(members: list[_Tpu], version: str, topology: str, expected: int | None,
                 reasons: list[str]) -> SliceShape:
    """The slice's table shape (most members' labels); label disagreements go to ``reasons``."""
    shape = table_shape(version, topology)
    if expected and expected != shape.num_hosts:
        with contextlib.suppress(InvalidTopologyError):  # keep Ray's rule if it cannot tile
            shape = table_shape(version, topology, shape.num_chips // expected)
        if shape.num_hosts != expected:
            reasons.append(f"expected {expected} hosts, {topology} has {shape.num_hosts}")
    want_pod = pod_key(shape.pod_type)  # hoisted: per host is slow
    for m in members:
        m_labels = m.node.get("labels") or {}
        if m.shape is not shape and m.key != (version, topology):
            reasons.append(f"labels inconsistent: worker {m.worker_id} says {m.spec}, "
                           f"slice is {shape.spec}")
        pod = m_labels.get(LABEL_POD_TYPE)
        if pod and pod_key(pod) != want_pod:
            reasons.append(f"labels inconsistent: worker {m.worker_id} pod type {pod}, "
                           f"topology {topology} is {shape.pod_type}")
    return shape


def _unknown_slice_shape(members: list[_Tpu], key: tuple[str, ...], expected: int | None,
                         reasons: list[str]) -> UnknownShape:
    """An :class:`UnknownShape` from the members' labels and ``TPU`` resources."""
    pod, accel, topology = key[1:]
    cph = max(whole_chips((m.node.get("resources_total") or {}).get("TPU", 0)) for m in members)
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
                 other: list[OtherNode], jobs: frozenset[str] = frozenset(),
                 pg_owners: Mapping[str, str] | None = None) -> SliceState:
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
    kept: dict[int, RawNode] = {}
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
                     jobs, pg_owners)
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


def _other(node: RawNode, reason: str) -> OtherNode:
    return OtherNode(node_id=str(node.get("node_id", "")), ip=str(node.get("ip", "")),
                     alive=bool(node.get("alive")), is_head=bool(node.get("is_head")),
                     labels=dict(node.get("labels") or {}),
                     resources_total=dict(node.get("resources_total") or {}), reason=reason)


def build_snapshot(raw: RawState, *, reservations: Mapping[str, str] | None = None,
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
    groups = raw.get("placement_groups") or []
    held, locked, pending = _bundles_by_node(groups, reservations)
    pg_owners: dict[str, str] = {}  # names a chip holder's group; read only when one is known
    if any(n.get("chip_holders") for n in raw.get("nodes") or []):
        pg_owners = {str(pg.get("placement_group_id", "")): _owner_name(pg, reservations)
                     for pg in groups}
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
                           job_owners, pg_owners) for name in sorted(by_slice)]
    if planned is not None:
        slices = apply_plan(slices, planned)
    return ClusterSnapshot(fetched_at=float(raw.get("fetched_at") or 0.0), slices=slices,
                           other_nodes=other, head_node_id=head_node_id, pending_owners=pending)

