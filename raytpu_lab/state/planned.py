"""What Kubernetes expects (a RayCluster's slices and their pods), merged into Ray's view; pure.

On Kubernetes, planned slices add what Ray cannot know: a host whose pod has not joined Ray yet is
``"provisioning"`` (its ``detail`` says why, e.g. ``"Pending: Unschedulable: ..."``), a slice none
of whose hosts has joined is listed anyway, and a slice KubeRay is deleting and recreating as a
unit has ``phase`` ``"replacing"``. :func:`raytpu_lab.state.model.build_snapshot` calls
:func:`apply_plan` when it is given ``planned`` slices.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from raytpu_lab.errors import InvalidTopologyError
from raytpu_lab.state._shapes import cached_shape
from raytpu_lab.state.snapshot import HostState, SlicePhase, SliceState

__all__ = ["PlannedHost", "PlannedSlice", "apply_plan"]


@dataclass(frozen=True)
class PlannedHost:
    """A host Kubernetes knows about (one pod), for hosts Ray may not show yet.

    Attributes:
        worker_id: Host index in the slice (label ``ray.io/replica-host-index``; 0 on single-host).
        pod: Pod name; ``""`` when KubeRay has not created the pod.
        phase: Pod phase (``Pending``, ``Running``, ``Failed``...), ``""`` without a pod.
        detail: Why it is not up, e.g. ``"Pending: Unschedulable: 0/3 nodes are available"``.
        terminating: The pod is being deleted (``metadata.deletionTimestamp`` set).
    """

    worker_id: int
    pod: str = ""
    phase: str = ""
    detail: str = ""
    terminating: bool = False


@dataclass(frozen=True)
class PlannedSlice:
    """A slice a RayCluster asks for, with what Kubernetes says about its pods.

    Attributes:
        name: Its ``TPU_NAME``, ``<group>-<replica>``.
        group: The worker group.
        version: Ray's accelerator version.
        topology: e.g. ``"4x4"``.
        chips_per_host: ``google.com/tpu`` per pod.
        hosts: What is known per host (any subset of worker ids).
        replacing: KubeRay is deleting and recreating the slice as a unit (a pod of it is
            terminating, failed, or missing while others exist).
    """

    name: str
    group: str
    version: str
    topology: str
    chips_per_host: int
    hosts: tuple[PlannedHost, ...] = ()
    replacing: bool = False



def _planned_detail(host: PlannedHost | None) -> str:
    if host is None or not host.pod:
        return "pod not created yet"
    if host.terminating:
        return f"pod {host.pod} terminating"
    return f"pod {host.pod} {host.detail or host.phase or 'starting'}"


def _with_plan(s: SliceState, plan: PlannedSlice) -> SliceState:
    by_worker = {h.worker_id: h for h in plan.hosts}
    hosts, reasons = [], [r for r in s.reasons
                          if not (r == "no worker 0" or (r.startswith("worker ") and r.endswith(" missing")))]
    waiting = 0
    for h in s.hosts:
        info = by_worker.get(h.worker_id)
        if h.state == "missing":
            detail = _planned_detail(info)
            h = dataclasses.replace(h, state="provisioning", detail=detail)
            reasons.append(f"worker {h.worker_id} provisioning ({detail})")
            waiting += 1
        elif info is not None and (info.terminating or info.phase == "Failed"):
            h = dataclasses.replace(h, detail=_planned_detail(info))
        hosts.append(h)
    phase: SlicePhase = "replacing" if plan.replacing else "provisioning" if waiting else ""
    if plan.replacing:
        reasons.insert(0, "KubeRay is replacing the slice (its pods are recreated as a unit)")
    return dataclasses.replace(s, hosts=hosts, reasons=list(dict.fromkeys(reasons)), phase=phase,
                               group=plan.group, health="degraded" if reasons else s.health)


def _absent_slice(plan: PlannedSlice) -> SliceState | None:
    shape = cached_shape(plan.version, plan.topology, plan.chips_per_host)
    if isinstance(shape, InvalidTopologyError):
        return None
    by_worker = {h.worker_id: h for h in plan.hosts}
    hosts = [HostState(w, None, "", "provisioning", 0, 0, None, chips_per_host=shape.chips_per_host,
                       detail=_planned_detail(by_worker.get(w))) for w in range(shape.num_hosts)]
    pods = sum(1 for h in plan.hosts if h.pod)
    reasons = [f"none of {shape.num_hosts} host(s) joined Ray yet ({pods} pod(s) created)"]
    reasons += [f"worker {h.worker_id}: {h.detail}" for h in hosts if h.detail != "pod not created yet"]
    if plan.replacing:
        reasons.insert(0, "KubeRay is replacing the slice (its pods are recreated as a unit)")
    return SliceState(name=plan.name, pod_type=shape.pod_type, version=shape.version,
                      topology=shape.topology, shape=shape, hosts=hosts, health="degraded",
                      reasons=reasons, owners=[], phase="replacing" if plan.replacing else "provisioning",
                      group=plan.group)


def apply_plan(slices: list[SliceState], planned: Iterable[PlannedSlice]) -> list[SliceState]:
    """Merge what Kubernetes expects into the slices Ray shows, sorted by name."""
    by_name = {s.name: s for s in slices}
    for plan in planned:
        if plan.name in by_name:
            by_name[plan.name] = _with_plan(by_name[plan.name], plan)
        else:
            absent = _absent_slice(plan)
            if absent is not None:
                by_name[plan.name] = absent
    return [by_name[n] for n in sorted(by_name)]
