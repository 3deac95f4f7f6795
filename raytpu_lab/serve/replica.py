"""Inside a replica served on a slice: the slice's other hosts, as actors on the replica's bundles.

A replica of a deployment served with :meth:`raytpu_lab.lab.Session.serve` runs in bundle 0 of
its placement group (Ray Serve puts the replica actor there) and holds that host's chips. Its
``__init__`` calls :func:`replica_hosts` to run code on every host of the slice: one Ray actor per
other bundle (``PlacementGroupSchedulingStrategy(placement_group, placement_group_bundle_index=i)``
with the bundle's ``TPU`` chips, as :mod:`raytpu_lab.reservations.spmd` does for ``run_on``), the
hosts in worker-id order (``ray.io/tpu-worker-id``), the replica's own host calling in-process.
The actors are the replica's children: Serve removes them with the replica's placement group.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from raytpu_lab.tpu.labels import LABEL_SLICE, LABEL_WORKER

__all__ = ["ReplicaHost", "ReplicaHosts", "replica_hosts"]


@dataclass(frozen=True)
class ReplicaHost:
    """One host of a replica's slice.

    Attributes:
        rank: Index in worker-id order.
        slice_name: The host's slice.
        worker_id: Its worker id (0: the slice's head).
        node_id: Ray node id (hex).
        local: Whether it is the replica's own host (called in-process).
    """

    rank: int
    slice_name: str
    worker_id: int
    node_id: str
    local: bool


@ray.remote(num_cpus=0)
class _HostProcess:
    """A process on one host of a replica's slice; runs what the replica sends."""

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    def where(self) -> dict[str, str]:
        ctx = ray.get_runtime_context()
        labels: dict[str, Any] = dict(ctx.get_node_labels())
        return {"node_id": ctx.get_node_id(), "slice": str(labels.get(LABEL_SLICE, "")),
                "worker": str(labels.get(LABEL_WORKER, "")), "pid": str(os.getpid())}


class ReplicaHosts:
    """Every host of the replica's slice, in worker-id order (see the module docstring).

    Attributes:
        hosts: The hosts, rank order.
    """

    def __init__(self, hosts: list[ReplicaHost], actors: list[Any | None]) -> None:
        self.hosts = hosts
        self._actors = actors

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``fn(*args, **kwargs)`` on every host at once (the replica's own host in this
        process, after sending to the others); returns the values in worker-id order.

        Raises:
            ray.exceptions.RayTaskError: It raised on another host (that host's traceback).
        """
        refs = [a.call.remote(fn, *args, **kwargs) if a is not None else None
                for a in self._actors]
        local = [fn(*args, **kwargs) if a is None else None for a in self._actors]
        return [ray.get(r) if r is not None else v for r, v in zip(refs, local, strict=True)]

    def __len__(self) -> int:
        return len(self.hosts)

    def __repr__(self) -> str:
        where = ", ".join(f"{h.slice_name} w{h.worker_id}{' (here)' if h.local else ''}"
                          for h in self.hosts)
        return f"ReplicaHosts({where})"


def replica_hosts() -> ReplicaHosts:
    """The hosts of the slice this replica serves on (call it in the deployment's ``__init__``).

    Returns:
        :class:`ReplicaHosts`: one host per bundle of the replica's placement group, worker-id
        order; the replica's own host has ``local=True``.

    Raises:
        RuntimeError: Not inside a replica with a placement group (a deployment served by
            ``serve`` on a reservation has one).
    """
    pg = ray.util.get_current_placement_group()
    if pg is None:
        raise RuntimeError("replica_hosts() runs inside a replica served on a reservation "
                           "(it has a placement group); this process has none.")
    table = ray.util.placement_group_table(pg)
    bundle_nodes: dict[int, str] = {int(k): v for k, v in table["bundles_to_node_id"].items()}
    labels = {n["NodeID"]: n.get("Labels") or {} for n in ray.nodes() if n.get("Alive")}
    chips = {int(k): float(v.get("TPU", 0) or 0) for k, v in table["bundles"].items()}
    order = sorted(bundle_nodes, key=lambda i: (labels.get(bundle_nodes[i], {}).get(LABEL_SLICE, ""),
                                                int(labels.get(bundle_nodes[i], {})
                                                    .get(LABEL_WORKER, "0") or 0)))
    hosts, actors = [], []
    for rank, index in enumerate(order):
        node = bundle_nodes[index]
        node_labels = labels.get(node, {})
        local = index == 0  # Ray Serve places the replica actor in bundle 0
        hosts.append(ReplicaHost(rank, node_labels.get(LABEL_SLICE, ""),
                                 int(node_labels.get(LABEL_WORKER, "0") or 0), node, local))
        actors.append(None if local else _HostProcess.options(  # type: ignore[attr-defined]
            resources={"TPU": chips[index]} if chips[index] else {},
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                pg, placement_group_bundle_index=index)).remote())
    return ReplicaHosts(hosts, actors)
