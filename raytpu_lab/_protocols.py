"""Shapes of what crosses a boundary, declared once: the raw cluster state and the map's messages.

Pure (stdlib ``typing`` only), in the style of anywidget's ``_protocols.py``: ``TypedDict`` s, and
``Literal`` ``type`` fields that tell messages apart.

Raw cluster state (:func:`raytpu_lab.state.fetch.fetch_raw_state` reads it from Ray,
:func:`raytpu_lab.state.model.build_snapshot` parses it; recordings in tests have the same form):
:class:`RawState` of :class:`RawNode` s and :class:`RawPlacementGroup` s. Every key is present in
what the reader returns; the parser still reads with defaults so a hand-made recording may omit
keys.

Snapshot as JSON (:meth:`raytpu_lab.state.snapshot.ClusterSnapshot.to_dict`, what a front end
other than the map receives): :class:`SnapshotDict` of :class:`SliceDict` s, :class:`HostDict` s and
:class:`OtherNodeDict` s.

Topology map wire protocol (:mod:`raytpu_lab.widgets.topology_map` <-> ``topology_map.js``)
-------------------------------------------------------------------------------------------------
This block is the one description of the field names both sides use; the JS file's header points
here and ``tests/unit/test_map_protocol.py`` checks that the JS reads only these names.

Hosts are sent as positional rows, not objects: a full state of a 4,096-host pod stays a few
hundred KB and a saved notebook small. The column names below are the names the JS gives each
position when it destructures a row (``const [code, free, reserved, busy, owner] = row``).

- Synced trait ``geometry`` (:class:`Geometry`; ``{}`` before the first snapshot): ``rev``,
  ``states`` (host states, indexed by a row's ``code``), ``colors`` (state -> CSS colour),
  ``summary_hosts``, ``chips_hosts``, ``slices`` (:class:`SliceGeometry`: ``name``,
  ``pod_type``, ``topology``, ``ndims``, ``dims``, ``grid`` (hosts per axis), ``block`` (chips per
  host per axis), ``wrap``, ``hosts``, ``known``).
- Kernel -> view ``{"type": "full"}`` (:class:`FullMessage`): ``geometry_rev``, ``rev``,
  ``slices`` (a :data:`SliceRow` per slice: :data:`SLICE_ROW`), ``hosts`` (per slice, a
  :data:`HostRow` per worker: :data:`HOST_ROW`), ``nodes`` (per slice, a :data:`NodeRow` per
  worker: :data:`NODE_ROW`), ``other`` (count of non-slice nodes), ``pending`` (owners waiting
  for placement).
- Kernel -> view ``{"type": "delta"}`` (:class:`DeltaMessage`): ``geometry_rev``, ``base`` (the
  ``rev`` it applies to), ``rev``, ``s`` (``[slice_index, *SLICE_ROW]``), ``h``
  (``[slice_index, worker, *HOST_ROW]``), ``n`` (``[slice_index, worker, *NODE_ROW]``),
  ``other``, ``pending``.
- Kernel -> view ``{"type": "details"}`` (:class:`DetailsMessage`): ``slice``, ``worker`` and,
  for a known host, ``node_id``, ``ip``, ``owner``, ``labels``.
- View -> kernel: ``{"type": "request_full"}`` (:class:`RequestFull`) and ``{"type":
  "details", "slice", "worker"}`` (:class:`DetailsRequest`).
- Synced trait ``selected`` (:class:`Selected`), set by the view: ``{"slice", "worker",
  "node_id"}`` for a host, ``{"slice"}`` for a slice title, ``{}`` for none.
"""

from __future__ import annotations

from typing import Literal, TypedDict

__all__ = [
    "RawNode",
    "RawChipHolder",
    "RawBundle",
    "RawPlacementGroup",
    "RawState",
    "PlacementGroupLifetime",
    "SLICE_ROW",
    "HOST_ROW",
    "NODE_ROW",
    "SliceRow",
    "HostRow",
    "NodeRow",
    "SliceChange",
    "HostChange",
    "NodeChange",
    "SliceGeometry",
    "Geometry",
    "FullMessage",
    "DeltaMessage",
    "DetailsMessage",
    "MapMessage",
    "RequestFull",
    "DetailsRequest",
    "ViewMessage",
    "Selected",
    "HostDict",
    "SliceDict",
    "OtherNodeDict",
    "SnapshotDict",
]

# --- raw cluster state ---------------------------------------------------------------------------


class _NodeFields(TypedDict):
    node_id: str
    """Ray node id (hex)."""
    ip: str
    alive: bool
    is_head: bool
    labels: dict[str, str]
    """Ray node labels, e.g. ``{"ray.io/tpu-slice-name": "tpu-v6e-4x4-0"}``."""
    resources_total: dict[str, float]


class RawChipHolder(TypedDict):
    """A worker process holding ``TPU`` chips of a node, as its raylet lists it."""

    chips: list[int]
    """Ray's chip ids (what Ray puts in the worker's ``TPU_VISIBLE_CHIPS``), ascending."""
    actor_id: str
    """Hex; ``""`` for a task's worker."""
    job_id: str
    pid: int
    class_name: str
    """The actor's class (``""`` for a task or an actor the GCS no longer lists)."""
    actor_name: str
    """A named actor's name, else ``""``."""
    placement_group_id: str
    """The actor's placement group (hex), else ``""``."""


class _NodeChipHolders(TypedDict, total=False):
    chip_holders: list[RawChipHolder]
    """Who holds which chip; absent when not read (no chip in use, the raylet did not answer,
    or an older recording): the map then draws chips by count only."""


class RawNode(_NodeFields, _NodeChipHolders):
    """One Ray node as :func:`~raytpu_lab.state.fetch.fetch_raw_state` reads it."""

    resources_available: dict[str, float]
    """Ray omits an exhausted resource: a missing ``TPU`` key is 0 free. ``{}`` for a dead node."""


class RawBundle(TypedDict):
    """One bundle of a placement group."""

    index: int
    node_id: str | None
    """The node it is placed on; ``None`` while unplaced."""
    resources: dict[str, float]


class _RawPlacementGroupCreator(TypedDict, total=False):
    creator: str
    """Name of the live named actor that created a group its name does not explain (e.g. a Serve
    replica's ``SERVE_REPLICA::<app>#<deployment>#<id>``); absent when none (or in older
    recordings)."""


class RawPlacementGroup(_RawPlacementGroupCreator):
    """A placement group that is not ``REMOVED``."""

    placement_group_id: str
    name: str
    """``""`` for an unnamed group; ``"raytpu:<name>"`` for reservation ``<name>``."""
    state: str
    """Ray's state: ``"PENDING"``, ``"CREATED"`` or ``"RESCHEDULING"``."""
    bundles: list[RawBundle]


class RawState(TypedDict):
    """The whole raw state of a cluster at one moment."""

    fetched_at: float
    """Seconds since the epoch."""
    nodes: list[RawNode]
    placement_groups: list[RawPlacementGroup]


class PlacementGroupLifetime(TypedDict):
    """What Ray's state API adds to a placement group (not in its placement-group table)."""

    is_detached: bool
    creator_job_id: str


# --- topology map: rows ----------------------------------------------------------------------------

SLICE_ROW = ("title", "state", "reasons")
"""Columns of a :data:`SliceRow`: display title, slice state, reasons joined by ``"; "``."""
HOST_ROW = ("code", "free", "reserved", "busy", "owner", "layout", "holders")
"""Columns of a :data:`HostRow`: index into ``geometry.states``, chips free / reserved / busy,
the owner holding most chips (``None`` for none), the chips' states by Ray chip id
(:attr:`~raytpu_lab.state.snapshot.HostState.chip_layout`, ``""``: drawn from the counts) and
who holds each chip (:attr:`~raytpu_lab.state.snapshot.HostState.chip_holders`, ``[]`` for none
known; sent only for slices drawn with chips, ``geometry.chips_hosts``)."""
NODE_ROW = ("node_id", "ip")
"""Columns of a :data:`NodeRow`: Ray node id (``None`` for a host not in Ray) and IP."""

SliceRow = tuple[str, str, str]
HostRow = tuple[int, int, int, int, str | None, str, list[str]]
NodeRow = tuple[str | None, str]
SliceChange = tuple[int, str, str, str]
"""``(slice_index, *SLICE_ROW)``."""
HostChange = tuple[int, int, int, int, int, int, str | None, str, list[str]]
"""``(slice_index, worker, *HOST_ROW)``."""
NodeChange = tuple[int, int, str | None, str]
"""``(slice_index, worker, *NODE_ROW)``."""

# --- topology map: geometry trait and messages ---------------------------------------------------


class SliceGeometry(TypedDict):
    """How one slice is laid out; the view derives every host and chip position from it."""

    name: str
    pod_type: str
    topology: str
    ndims: int
    dims: list[int]
    """Chips per axis."""
    grid: list[int]
    """Hosts per axis; worker ids run row-major, x fastest."""
    block: list[int]
    """Chips per host per axis."""
    wrap: list[bool]
    """ICI wraps around along each axis."""
    hosts: int
    known: bool
    """False for a slice of unknown shape: a schematic grid without ICI links."""


class Geometry(TypedDict):
    """The ``geometry`` trait: changes only when the set of slices or their shapes changes."""

    rev: int
    states: list[str]
    colors: dict[str, str]
    summary_hosts: int
    chips_hosts: int
    slices: list[SliceGeometry]


class FullMessage(TypedDict):
    """Every host, sent on a view's request and after every re-layout."""

    type: Literal["full"]
    geometry_rev: int
    rev: int
    slices: list[SliceRow]
    hosts: list[list[HostRow]]
    nodes: list[list[NodeRow]]
    other: int
    pending: list[str]


class DeltaMessage(TypedDict):
    """What changed since revision ``base``; never sent when nothing changed."""

    type: Literal["delta"]
    geometry_rev: int
    base: int
    rev: int
    s: list[SliceChange]
    h: list[HostChange]
    n: list[NodeChange]
    other: int
    pending: list[str]


class _DetailsKey(TypedDict):
    type: Literal["details"]
    slice: str
    worker: int


class DetailsMessage(_DetailsKey, total=False):
    """A host's large, rarely read fields (the reply to a :class:`DetailsRequest`)."""

    node_id: str | None
    ip: str
    owner: str | None
    labels: dict[str, str]


MapMessage = FullMessage | DeltaMessage | DetailsMessage
"""Kernel -> view messages."""


class RequestFull(TypedDict):
    """A view asks for a :class:`FullMessage` (on render, or when a delta does not apply)."""

    type: Literal["request_full"]


class DetailsRequest(_DetailsKey):
    """A view asks for one host's :class:`DetailsMessage` (on hover)."""


ViewMessage = RequestFull | DetailsRequest
"""View -> kernel messages."""


class Selected(TypedDict, total=False):
    """The ``selected`` trait: ``{}`` for none, ``{"slice"}`` for a slice, all three for a host."""

    slice: str
    worker: int
    node_id: str | None


# --- snapshot as JSON (ClusterSnapshot.to_dict) ----------------------------------------------------


class HostDict(TypedDict):
    """:meth:`raytpu_lab.state.snapshot.HostState.to_dict`: its fields plus ``chip_states``."""

    worker_id: int
    node_id: str | None
    ip: str
    state: str
    chips: int
    chips_free: int
    owner: str | None
    labels: dict[str, str]
    chips_reserved: int
    chips_busy: int
    chips_per_host: int
    detail: str
    chip_states: list[str]
    chip_holders: list[str]


class SliceDict(TypedDict):
    """:meth:`raytpu_lab.state.snapshot.SliceState.to_dict`: fields and totals."""

    name: str
    pod_type: str
    version: str
    topology: str
    shape: dict[str, str | int]
    """The shape's fields (``version``, ``topology``, ``chips_per_host``; more when unknown)."""
    shape_known: bool
    hosts: list[HostDict]
    health: str
    reasons: list[str]
    owners: list[str]
    head_locked: bool
    state: str
    phase: str
    group: str
    hosts_alive: int
    hosts_expected: int
    chips_total: int
    chips_free: int
    chips_expected: int


class OtherNodeDict(_NodeFields):
    """:meth:`raytpu_lab.state.snapshot.OtherNode.to_dict`: the node and why it is no slice host."""

    reason: str


class SnapshotDict(TypedDict):
    """:meth:`raytpu_lab.state.snapshot.ClusterSnapshot.to_dict`."""

    fetched_at: float
    head_node_id: str | None
    slices: list[SliceDict]
    other_nodes: list[OtherNodeDict]
    pending_owners: list[str]
    total_chips: int
    free_chips: int
