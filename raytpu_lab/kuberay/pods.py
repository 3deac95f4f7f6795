"""A RayCluster's worker pods -> the slices Kubernetes expects, for the state model (pure).

KubeRay labels every worker pod with ``ray.io/group`` and (``RayMultiHostIndexing``, on by default)
``ray.io/worker-group-replica-index``; multi-host pods also get ``ray.io/replica-host-index`` and
``ray.io/worker-group-replica-name``. With ``numOfHosts > 1`` a slice is created and deleted as a unit:
if a pod of a replica is missing, KubeRay deletes the rest (``reconcileMultiHostWorkerGroup``), so a
slice with a terminating, failed or missing pod beside live ones is being **replaced**.
Pods without index labels (older KubeRay) fill the group's free host slots in name order.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from raytpu_lab.kuberay.groups import RayClusterPlan
from raytpu_lab.state.planned import PlannedHost, PlannedSlice
from raytpu_lab.tpu.labels import KUBERAY_LABEL_GROUP, KUBERAY_LABEL_HOST, KUBERAY_LABEL_REPLICA

__all__ = ["pod_problem", "planned_slices", "LABEL_GROUP", "LABEL_REPLICA", "LABEL_HOST"]

LABEL_GROUP = KUBERAY_LABEL_GROUP
LABEL_REPLICA = KUBERAY_LABEL_REPLICA
LABEL_HOST = KUBERAY_LABEL_HOST
_MAX_DETAIL = 200


def _short(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= _MAX_DETAIL else text[:_MAX_DETAIL - 3] + "..."


def pod_problem(pod: Mapping[str, Any]) -> str:
    """Why a pod is not a running Ray node, one line, e.g. ``"Pending: Unschedulable: 0/3 nodes
    are available: 3 Insufficient google.com/tpu"`` or ``"Running: CrashLoopBackOff (ray-worker)"``;
    ``"Running"`` when nothing is wrong.

    Reads ``status.phase``, the ``PodScheduled`` condition, and waiting / terminated states of init
    and app containers (``wait-gcs-ready`` is KubeRay's init container).
    """
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    phase = str(status.get("phase") or "Unknown")
    if meta.get("deletionTimestamp"):
        return f"{phase}: terminating"
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return _short(f"{phase}: {cond.get('reason') or 'NotScheduled'}: {cond.get('message') or ''}"
                          .rstrip(": "))
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(key) or []:
            state = cs.get("state") or {}
            waiting, terminated = state.get("waiting"), state.get("terminated")
            name = cs.get("name", "?")
            if waiting and waiting.get("reason") not in (None, "PodInitializing"):
                message = f": {waiting['message']}" if waiting.get("message") else ""
                return _short(f"{phase}: {waiting['reason']} ({name}){message}")
            if terminated and (key == "containerStatuses" or terminated.get("exitCode")):
                return _short(f"{phase}: {terminated.get('reason') or 'Terminated'} ({name}, exit "
                              f"code {terminated.get('exitCode')})")
    if status.get("reason") or status.get("message"):
        return _short(f"{phase}: {status.get('reason') or ''} {status.get('message') or ''}".strip())
    return phase


def _int_label(labels: Mapping[str, str], key: str) -> int | None:
    value = str(labels.get(key, ""))
    return int(value) if value.isdecimal() else None


def planned_slices(plan: RayClusterPlan, pods: Iterable[Mapping[str, Any]]) -> list[PlannedSlice]:
    """Every slice the plan expects, with what its pods say.

    Args:
        plan: The RayCluster's plan (:func:`raytpu_lab.kuberay.parse_raycluster`).
        pods: Pod objects of the cluster (label ``ray.io/cluster=<name>``), as the API returns them.

    Returns:
        One :class:`~raytpu_lab.state.model.PlannedSlice` per expected slice, in plan order, plus
        slices of pods whose replica index is beyond ``replicas`` (scaling down: being deleted).
    """
    groups = {g.name: g for g in plan.tpu_groups}
    placed: dict[tuple[str, int], dict[int, Mapping[str, Any]]] = defaultdict(dict)
    unplaced: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name", ""))):
        labels = (pod.get("metadata") or {}).get("labels") or {}
        group = groups.get(str(labels.get(LABEL_GROUP, "")))
        if group is None or labels.get("ray.io/node-type") == "head":
            continue
        replica = _int_label(labels, LABEL_REPLICA)
        host = _int_label(labels, LABEL_HOST) if group.num_of_hosts > 1 else 0
        if replica is None or host is None or host in placed[(group.name, replica)]:
            unplaced[group.name].append(pod)
        else:
            placed[(group.name, replica)][host] = pod
    out: list[PlannedSlice] = []
    for group in plan.tpu_groups:
        replicas = 0 if group.suspend else group.replicas
        beyond = sorted(r for (g, r) in placed if g == group.name and r >= replicas)
        for replica in [*range(replicas), *beyond]:
            slots = placed[(group.name, replica)]
            for host in range(group.num_of_hosts):
                if host not in slots and unplaced[group.name] and replica < replicas:
                    slots[host] = unplaced[group.name].pop(0)
            hosts = tuple(_planned_host(h, slots.get(h)) for h in range(group.num_of_hosts))
            out.append(PlannedSlice(
                name=f"{group.name}-{replica}", group=group.name, version=group.shape.version,
                topology=group.shape.topology, chips_per_host=group.chips_per_host, hosts=hosts,
                replacing=replica >= replicas or _replacing(hosts)))
    return out


def _planned_host(worker_id: int, pod: Mapping[str, Any] | None) -> PlannedHost:
    if pod is None:
        return PlannedHost(worker_id)
    meta = pod.get("metadata") or {}
    phase = str((pod.get("status") or {}).get("phase") or "Unknown")
    return PlannedHost(worker_id, pod=str(meta.get("name", "")), phase=phase,
                       detail=pod_problem(pod), terminating=bool(meta.get("deletionTimestamp")))


def _replacing(hosts: tuple[PlannedHost, ...]) -> bool:
    if any(h.terminating or h.phase == "Failed" for h in hosts):
        return True
    created = sum(1 for h in hosts if h.pod)
    # Some pods of a multi-host slice exist, others do not: KubeRay deletes and recreates it.
    return len(hosts) > 1 and 0 < created < len(hosts) and any(
        h.phase == "Running" for h in hosts)
