"""Cluster state: the pure model of slices, hosts and chips.

Records in :mod:`raytpu_lab.state.snapshot`, the parser in :mod:`raytpu_lab.state.model`, the
Kubernetes plan in :mod:`raytpu_lab.state.planned`. Only the pure model is exported here; the Ray reader lives in :mod:`raytpu_lab.state.fetch`
(import it directly), so importing :mod:`raytpu_lab.state` never imports Ray.
"""

from __future__ import annotations

from raytpu_lab.state.model import (
    HOST_STATES,
    RESERVATION_PREFIX,
    SLICE_STATES,
    ClusterSnapshot,
    HostState,
    OtherNode,
    SliceState,
    build_snapshot,
)

__all__ = [
    "HOST_STATES",
    "RESERVATION_PREFIX",
    "SLICE_STATES",
    "ClusterSnapshot",
    "HostState",
    "OtherNode",
    "SliceState",
    "build_snapshot",
]
