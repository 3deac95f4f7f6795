"""Readiness of a RayCluster from its ``.status`` (pure).

KubeRay (gate ``RayClusterStatusConditions``, on by default) sets the conditions ``HeadPodReady``
and ``RayClusterProvisioned`` (the latter once, when every pod first ran), plus ``ReplicaFailure``,
``RayClusterSuspending`` and ``RayClusterSuspended``; the older ``state`` field is ``"ready"`` once
all pods run. Worker counts count pods, not slices (``shared/kuberay/README.md`` (e)).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Readiness", "readiness"]


@dataclass(frozen=True)
class Readiness:
    """What a RayCluster's status says.

    Attributes:
        head_ready: ``HeadPodReady`` is ``True`` (or, without conditions, ``state == "ready"``):
            a Ray Client can connect.
        provisioned: ``RayClusterProvisioned`` is ``True``: every pod ran at least once.
        state: ``status.state`` (``"ready"``, ``"suspended"``, ``"failed"`` or ``""``).
        desired_workers: ``status.desiredWorkerReplicas`` (pods).
        ready_workers: ``status.readyWorkerReplicas`` (pods).
        conditions: ``{type: (status, reason, message)}``.
        suspended: ``RayClusterSuspended`` is ``True`` or ``state == "suspended"``.
    """

    head_ready: bool
    provisioned: bool
    state: str
    desired_workers: int
    ready_workers: int
    conditions: Mapping[str, tuple[str, str, str]] = field(default_factory=dict)
    suspended: bool = False

    @property
    def workers_ready(self) -> bool:
        """Every desired worker pod is ready (all TPU slices can be expected in Ray)."""
        return self.ready_workers >= self.desired_workers

    def explain(self) -> str:
        """One line: state, worker counts and any condition that is not ``True``."""
        parts = [f"state {self.state or 'unset'}",
                 f"{self.ready_workers}/{self.desired_workers} worker pods ready"]
        for kind, (status, reason, message) in self.conditions.items():
            if status != "True" or kind == "ReplicaFailure":
                text = f"{kind}={status}" + (f" ({reason}" + (f": {message}" if message else "") + ")"
                                             if reason else "")
                parts.append(text)
        return "; ".join(parts)


def readiness(raycluster: Mapping[str, Any]) -> Readiness:
    """Read ``.status`` of a RayCluster object (as the API returns it)."""
    status = raycluster.get("status") or {}
    conditions = {str(c.get("type")): (str(c.get("status", "")), str(c.get("reason", "")),
                                       str(c.get("message", ""))[:300])
                  for c in status.get("conditions") or [] if isinstance(c, Mapping)}
    state = str(status.get("state") or "")
    head = conditions.get("HeadPodReady")
    head_ready = head[0] == "True" if head else state == "ready"
    provisioned = conditions.get("RayClusterProvisioned", ("",))[0] == "True" or \
        (not conditions and state == "ready")
    suspended = conditions.get("RayClusterSuspended", ("",))[0] == "True" or state == "suspended"
    return Readiness(head_ready=head_ready, provisioned=provisioned, state=state,
                     desired_workers=int(status.get("desiredWorkerReplicas") or 0),
                     ready_workers=int(status.get("readyWorkerReplicas") or 0),
                     conditions=conditions, suspended=suspended)
