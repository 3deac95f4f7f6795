"""Synthetic raw Ray states of any size, for benchmarks and pod-scale tests; pure (stdlib only).

The dicts have the shape :func:`raytpu_lab.state.fetch.fetch_raw_state` returns (see that module's
docstring) and carry the labels and resources Ray 2.60 derives from GKE's TPU environment, so
:func:`raytpu_lab.state.model.build_snapshot` reads them like a real cluster's.

Example::

    >>> raw = synthetic_raw_state([("v6e:16x16", 2)])
    >>> len(raw["nodes"])
    128
    >>> busy = mark_busy(raw, 0.01, seed=1)   # 1% of hosts lose their free chips
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterable

from raytpu_lab._protocols import RawNode, RawState
from raytpu_lab.tpu.labels import (
    LABEL_ACCELERATOR,
    LABEL_POD_TYPE,
    LABEL_SLICE,
    LABEL_TOPOLOGY,
    LABEL_WORKER,
)
from raytpu_lab.tpu.topology import SliceShape, parse_spec

__all__ = ["synthetic_raw_state", "mark_busy"]


def _node(shape: SliceShape, slice_name: str, worker: int, serial: int) -> RawNode:
    node_id = f"{serial:056x}"
    ip = f"10.{serial >> 16 & 255}.{serial >> 8 & 255}.{serial & 255}"
    total: dict[str, float] = {
        "CPU": 8.0, "TPU": float(shape.chips_per_host), slice_name: 1.0,
        f"accelerator_type:{shape.accelerator_type}": 1.0, f"node:{ip}": 1.0,
        "memory": 64e9, "object_store_memory": 8e9,
    }
    if worker == 0:
        total[shape.head_resource] = 1.0
    labels = {
        LABEL_SLICE: slice_name, LABEL_WORKER: str(worker), LABEL_TOPOLOGY: shape.topology,
        LABEL_POD_TYPE: shape.pod_type, LABEL_ACCELERATOR: shape.accelerator_type,
        "ray.io/node-group": f"tpu-{shape.version}-{shape.topology}", "ray.io/node-id": node_id,
    }
    return RawNode(node_id=node_id, alive=True, ip=ip, is_head=False, labels=labels,
                   resources_total=total, resources_available=dict(total))


def synthetic_raw_state(slices: Iterable[tuple[str, int]], *,
                        fetched_at: float = 1.7e9) -> RawState:
    """A raw state of idle slices plus a CPU head node.

    Args:
        slices: ``(spec, count)`` pairs, e.g. ``[("v6e:16x16", 64)]``; slices are named
            ``tpu-<version>-<topology>-<i>`` with ``i`` counting per spec.
        fetched_at: The ``fetched_at`` stamp.

    Returns:
        ``{"fetched_at", "nodes", "placement_groups"}`` with every host alive and free.

    Raises:
        InvalidTopologyError: A spec names no valid slice shape.
    """
    head = RawNode(node_id="f" * 56, alive=True, ip="10.255.255.254", is_head=True, labels={},
                   resources_total={"CPU": 8.0, "node:__internal_head__": 1.0},
                   resources_available={"CPU": 8.0, "node:__internal_head__": 1.0})
    nodes = [head]
    serial = 1
    for spec, count in slices:
        shape = parse_spec(spec)
        for i in range(count):
            name = f"tpu-{shape.version}-{shape.topology}-{i}"
            for worker in range(shape.num_hosts):
                nodes.append(_node(shape, name, worker, serial))
                serial += 1
    return RawState(fetched_at=fetched_at, nodes=nodes, placement_groups=[])


def mark_busy(raw: RawState, fraction: float, *, seed: int = 0) -> RawState:
    """A copy of ``raw`` where ``fraction`` of the TPU hosts have no free chip (``busy``).

    Ray omits an exhausted resource from ``resources_available``, so the ``TPU`` key is dropped.

    Args:
        raw: A raw state (not modified).
        fraction: Share of TPU hosts to mark, 0..1; at least one host when above 0.
        seed: Seed of the choice of hosts.

    Returns:
        The new raw state.
    """
    out = copy.copy(raw)
    nodes = list(raw["nodes"])
    tpu = [i for i, n in enumerate(nodes) if n["resources_total"].get("TPU")]
    count = min(len(tpu), max(1 if fraction > 0 else 0, round(len(tpu) * fraction)))
    for i in random.Random(seed).sample(tpu, count):
        node = RawNode(**nodes[i])
        node["resources_available"] = {k: v for k, v in node["resources_available"].items()
                                       if k != "TPU"}
        nodes[i] = node
    out["nodes"] = nodes
    out["fetched_at"] = float(raw.get("fetched_at") or 0.0) + 1.0
    return out
