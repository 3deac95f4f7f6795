"""The one place that reads Ray's cluster state.

:func:`fetch_raw_state` returns plain JSON-able dicts; :func:`raytpu_lab.state.model.build_snapshot`
turns them into slices, hosts and chips. Keeping the raw form plain lets tests record it from a real
cluster and replay it without Ray.

Raw state shape (all keys always present; declared as :class:`raytpu_lab._protocols.RawState`)::

    {
      "fetched_at": 1733000000.0,                # seconds since the epoch
      "nodes": [{
          "node_id": "ab12…", "alive": True, "ip": "127.0.0.1", "is_head": False,
          "labels": {"ray.io/tpu-slice-name": "tpu-v6e-4x4-0", …},
          "resources_total": {"CPU": 4.0, "TPU": 4.0, …},
          "resources_available": {"CPU": 4.0, …},   # Ray omits exhausted resources
          "chip_holders": [{"chips": [1, 2], "actor_id": "…", "job_id": "01000000",  # only
                            "pid": 8090, "class_name": "Holder", "actor_name": "",   # where
                            "placement_group_id": ""}],                # chips are in use
      }],
      "placement_groups": [{
          "placement_group_id": "…", "name": "raytpu:r1", "state": "CREATED",
          "bundles": [{"index": 0, "node_id": "…" | None, "resources": {"TPU": 4.0}}],
          "creator": "SERVE_REPLICA::app#LLMServer#x1",  # only where the name says nothing
      }],                                                  # and a named actor made it
    }
"""

from __future__ import annotations

import functools
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray

from raytpu_lab import _ray_private
from raytpu_lab._protocols import (
    PlacementGroupLifetime,
    RawBundle,
    RawChipHolder,
    RawNode,
    RawPlacementGroup,
    RawState,
)
from raytpu_lab.state.model import SERVE_REPLICA_PREFIX
from raytpu_lab.tpu.labels import RESERVATION_PREFIX

__all__ = ["fetch_raw_state", "fetch_placement_group_lifetimes", "count_alive_nodes",
           "fetch_serve_replicas", "fetch_serve_status"]


def fetch_raw_state() -> RawState:
    """Read nodes (labels, total and available resources) and placement groups from Ray.

    Uses ``ray.nodes()`` and ``ray.util.placement_group_table()`` (public) and Ray's per-node
    available resources (private; see :mod:`raytpu_lab._ray_private`). About 5 ms for 9 nodes,
    plus, for each node with chips in use, one call to its raylet for who holds which chip
    (in parallel, ~5-50 ms; see :func:`raytpu_lab._ray_private.chip_holders_on_node`) and, once
    per actor, the GCS's record of it.
    Over Ray Client (``ray://``; e.g. ``connect --kuberay`` through a port-forward) the per-node
    availability needs a direct GCS connection, so the same read runs inside the cluster as a
    zero-CPU task on the head node (raytpu_lab reaches the workers through the job's
    ``runtime_env``; see :func:`raytpu_lab.cluster.connect.job_runtime_env`).

    Returns:
        The raw state described in this module's docstring.

    Raises:
        ray.exceptions.RaySystemError: Ray is not initialised (callers check first).
    """
    if ray.util.client.ray.is_connected():  # type: ignore[no-untyped-call]
        state: RawState = ray.get(_read_in_cluster.remote())
        return state
    return _read_here()


@ray.remote(num_cpus=0, resources={"node:__internal_head__": 0.001})
def _read_in_cluster() -> RawState:
    return _read_here()


def _read_here() -> RawState:
    available = _ray_private.available_resources_per_node()
    nodes: list[RawNode] = []
    raylets: dict[str, tuple[str, int]] = {}
    for node in ray.nodes():  # type: ignore[no-untyped-call]
        node_id = node["NodeID"]
        if node.get("Alive") and _chips_in_use(node.get("Resources") or {},
                                               available.get(node_id, {})):
            raylets[node_id] = (node.get("NodeManagerAddress", ""),
                                int(node.get("NodeManagerPort") or 0))
        nodes.append(RawNode(
            node_id=node_id,
            alive=bool(node.get("Alive")),
            ip=node.get("NodeManagerAddress", ""),
            is_head=bool(node.get("Resources", {}).get("node:__internal_head__")),
            labels=dict(node.get("Labels") or {}),
            resources_total=dict(node.get("Resources") or {}),
            resources_available=dict(available.get(node_id, {})) if node.get("Alive") else {},
        ))
    groups: list[RawPlacementGroup] = []
    for pg_id, pg in ray.util.placement_group_table().items():
        if pg.get("state") == "REMOVED":
            continue
        to_node = pg.get("bundles_to_node_id", {})
        groups.append(RawPlacementGroup(
            placement_group_id=pg_id,
            name=pg.get("name", ""),
            state=pg.get("state", ""),
            bundles=[
                RawBundle(index=int(i),
                          node_id=to_node.get(i) if _is_node(to_node.get(i)) else None,
                          resources=dict(res))
                for i, res in sorted(pg.get("bundles", {}).items())
            ],
        ))
    _add_creators(groups)
    _add_chip_holders(nodes, raylets)
    return RawState(fetched_at=time.time(), nodes=nodes, placement_groups=groups)


def _chips_in_use(total: dict[str, float], available: dict[str, float]) -> bool:
    return float(total.get("TPU", 0) or 0) > float(available.get("TPU", 0) or 0)


_RAYLET_TIMEOUT_S = 2.0
_RAYLET_THREADS = 16
_SILENT_FOR_S = 60.0
_SILENT: dict[tuple[str, int], float] = {}  # raylet address -> when it last failed to answer


@functools.cache
def _raylet_pool() -> ThreadPoolExecutor:
    # One pool for the process: a refresh a second would otherwise start its threads anew.
    return ThreadPoolExecutor(_RAYLET_THREADS, "raytpu-chips")


def _add_chip_holders(nodes: list[RawNode], raylets: dict[str, tuple[str, int]]) -> None:
    """Name who holds which chip on each node with chips in use (its raylet's worker list, in
    parallel, one round trip each); a node whose raylet does not answer in
    ``_RAYLET_TIMEOUT_S`` is drawn by counts only, and not asked again for ``_SILENT_FOR_S``."""
    now = time.monotonic()
    raylets = {n: a for n, a in raylets.items() if now - _SILENT.get(a, -1e9) > _SILENT_FOR_S}
    if not raylets:
        return

    def ask(node_id: str) -> tuple[str, list[dict[str, Any]]]:
        try:
            return node_id, _ray_private.chip_holders_on_node(*raylets[node_id],
                                                              timeout_s=_RAYLET_TIMEOUT_S)
        except Exception:  # e.g. no route to its port from here: not asked again for a while,
            _SILENT[raylets[node_id]] = time.monotonic()  # so a refresh never waits on it
            return node_id, []

    found = dict(_raylet_pool().map(ask, raylets))
    try:
        actors = _ray_private.actor_descriptions(
            {h["actor_id"] for hs in found.values() for h in hs if h["actor_id"]})
    except Exception:
        actors = {}
    for node in nodes:
        listed = found.get(node["node_id"])
        if not listed:
            continue
        node["chip_holders"] = [RawChipHolder(
            chips=h["chips"], actor_id=h["actor_id"], job_id=h["job_id"], pid=h["pid"],
            class_name=actors.get(h["actor_id"], {}).get("class_name", ""),
            actor_name=actors.get(h["actor_id"], {}).get("name", ""),
            placement_group_id=h["placement_group_id"]
            or actors.get(h["actor_id"], {}).get("placement_group_id", ""))
            for h in listed]


def _add_creators(groups: list[RawPlacementGroup]) -> None:
    """Name the actor that made each group its name does not explain (a Serve LLM replica makes
    its own slice's, unnamed or ``dp_<rank>``); the map is still drawn, with the group
    unattributed, if Ray's tables cannot be read so."""
    unexplained = [g["placement_group_id"] for g in groups
                   if not g["name"].startswith((RESERVATION_PREFIX, SERVE_REPLICA_PREFIX))]
    try:
        creators = _ray_private.placement_group_creator_names(unexplained)
    except Exception:
        return
    for group in groups:
        if group["placement_group_id"] in creators:
            group["creator"] = creators[group["placement_group_id"]]


def _is_node(node_id: str | None) -> bool:
    # Ray reports an unplaced bundle with an all-zero node id.
    return node_id is not None and node_id.strip("0") != ""


def fetch_placement_group_lifetimes() -> dict[str, PlacementGroupLifetime]:
    """``{placement group id: {"is_detached": bool, "creator_job_id": str}}`` for live groups.

    Ray's placement-group table has no lifetime; its state API (``ray.util.state
    .list_placement_groups(detail=True)``, served by the dashboard) has. Slower than
    :func:`fetch_raw_state` (an HTTP round trip, ~50-200 ms), so it is read only when listing
    reservations, never on every refresh.

    Raises:
        ray.util.state.exception.RayStateApiException: The dashboard did not answer.
    """
    from ray.util.state import list_placement_groups

    # An explicit address: another local cluster may run on this machine at the same time.
    address = ray.get_runtime_context().gcs_address
    return {
        pg.placement_group_id: PlacementGroupLifetime(
            is_detached=bool(pg.is_detached), creator_job_id=str(pg.creator_job_id or ""))
        for pg in list_placement_groups(address=address, detail=True, limit=10_000,
                                        raise_on_missing_output=False)
        if pg.state != "REMOVED"
    }


def fetch_placement_group_states() -> dict[str, dict[str, str]]:
    """``{placement group id (hex): {"state": "CREATED" | "PENDING" | "REMOVED" | ..., "name":
    its name or ""}}`` for every placement group Ray's table lists (removed ones included), from
    ``ray.util.placement_group_table()``. A training run uses it to tell its own groups (new since
    launch) and whether they are gone.

    Raises:
        ray.exceptions.RayError: Ray could not be read (the caller retries or gives up).
    """
    return {pg: {"state": str(info.get("state") or ""), "name": str(info.get("name") or "")}
            for pg, info in ray.util.placement_group_table().items()}


def count_alive_nodes() -> int:
    """How many Ray nodes are alive (head included), from ``ray.nodes()``; a cheap read to wait
    for nodes to join.

    Raises:
        ray.exceptions.RaySystemError: Ray is not initialised (callers check first).
    """
    nodes: list[dict[str, object]] = ray.nodes()  # type: ignore[no-untyped-call]
    return sum(1 for n in nodes if n.get("Alive"))


def fetch_serve_replicas(app: str) -> list[dict[str, str]]:
    """The replica actors of Serve application ``app`` (alive and dead): ``[{"actor_id",
    "class_name", "state", "node_id", "placement_group_id", "pid", "death_cause"}]``.

    Ray Serve names each replica actor's class ``ServeReplica:<app>:<deployment>``; the state API
    (``ray.util.state.list_actors``, served by the dashboard) gives its node and placement group.

    Raises:
        ray.util.state.exception.RayStateApiException: The dashboard did not answer.
    """
    from ray.util.state import list_actors

    address = ray.get_runtime_context().gcs_address
    prefix = f"ServeReplica:{app}:"
    return [{"actor_id": str(a.actor_id), "class_name": str(a.class_name), "state": str(a.state),
             "node_id": str(a.node_id or ""), "placement_group_id": str(a.placement_group_id or ""),
             "pid": str(a.pid or ""), "death_cause": str(a.death_cause or "")}
            for a in list_actors(address=address, detail=True, limit=10_000,
                                 raise_on_missing_output=False)
            if str(a.class_name).startswith(prefix)]


def fetch_serve_status() -> dict[str, dict[str, object]]:
    """Serve's applications now, from ``ray.serve.status()`` (public): ``{app: {"status",
    "message", "deployments": {name: {"status", "message", "replica_states":
    {state: count}}}}}``; ``{}`` when Serve is not running on the cluster.
    """
    from ray import serve

    if _ray_private.serve_client() is None:  # Serve not started: status() would start it
        return {}
    out: dict[str, dict[str, object]] = {}
    for name, app in serve.status().applications.items():
        out[name] = {"status": str(app.status.value if hasattr(app.status, "value") else app.status),
                     "message": app.message or "",
                     "deployments": {d: {"status": str(getattr(st.status, "value", st.status)),
                                         "message": st.message or "",
                                         "replica_states": {str(getattr(k, "value", k)): int(v)
                                                            for k, v in st.replica_states.items()}}
                                     for d, st in app.deployments.items()}}
    return out
