"""build_snapshot(..., planned=...): what Kubernetes expects merged into what Ray shows (pure)."""

from __future__ import annotations

import json
from pathlib import Path

from raytpu_lab.kuberay import build_raycluster, parse_raycluster
from raytpu_lab.kuberay.pods import planned_slices, pod_problem
from raytpu_lab.state.model import PlannedHost, PlannedSlice, build_snapshot

from ..k8s_standin import worker_pod

RAW = json.loads((Path(__file__).parent / "fixtures" / "raw_v6e_4x4_x2_idle.json").read_text())
GROUP = "tpu-v6e-4x4"


def _plan(name: str, hosts: tuple[PlannedHost, ...] = (), replacing: bool = False) -> PlannedSlice:
    return PlannedSlice(name, GROUP, "v6e", "4x4", 4, hosts, replacing)


def _running(slice_index: int) -> tuple[PlannedHost, ...]:
    return tuple(PlannedHost(w, f"pod-{slice_index}-{w}", "Running", "Running") for w in range(4))


def test_no_plan_changes_nothing() -> None:
    assert build_snapshot(RAW, planned=None) == build_snapshot(RAW)
    plain = build_snapshot(RAW)
    with_plan = build_snapshot(RAW, planned=[_plan("tpu-v6e-4x4-0", _running(0)),
                                             _plan("tpu-v6e-4x4-1", _running(1))])
    assert [s.state for s in with_plan.slices] == [s.state for s in plain.slices] == ["free", "free"]
    assert [s.group for s in with_plan.slices] == [GROUP, GROUP]


def test_absent_slice_is_listed_as_provisioning_with_pod_reasons() -> None:
    pending = tuple(PlannedHost(w, f"p{w}", "Pending", "Pending: Unschedulable: 0/3 nodes are available")
                    for w in range(2))
    snap = build_snapshot(RAW, planned=[_plan("tpu-v6e-4x4-2", pending)])
    new = snap.slice("tpu-v6e-4x4-2")
    assert new.state == "provisioning" and new.health == "degraded" and new.hosts_alive == 0
    assert [h.state for h in new.hosts] == ["provisioning"] * 4
    assert new.hosts[0].detail == "pod p0 Pending: Unschedulable: 0/3 nodes are available"
    assert new.hosts[3].detail == "pod not created yet"
    assert new.reasons[0] == "none of 4 host(s) joined Ray yet (2 pod(s) created)"
    assert new.hosts[0].chip_states() == ["provisioning"] * 4
    assert snap.total_chips == 32  # provisioning chips are not counted as there
    assert [s.name for s in snap.idle_slices("v6e-16")] == ["tpu-v6e-4x4-0", "tpu-v6e-4x4-1"]
    assert new.to_dict()["state"] == "provisioning"


def test_host_not_joined_yet_and_slice_being_replaced() -> None:
    raw = {**RAW, "nodes": [n for n in RAW["nodes"] if not (
        (n.get("labels") or {}).get("ray.io/tpu-slice-name") == "tpu-v6e-4x4-1"
        and n["labels"].get("ray.io/tpu-worker-id") == "3")]}
    crash = PlannedHost(3, "pod-1-3", "Running", "Running: CrashLoopBackOff (ray-worker)")
    snap = build_snapshot(raw, planned=[_plan("tpu-v6e-4x4-1", (*_running(1)[:3], crash))])
    s = snap.slice("tpu-v6e-4x4-1")
    assert s.state == "provisioning" and s.hosts[3].state == "provisioning"
    assert "worker 3 provisioning (pod pod-1-3 Running: CrashLoopBackOff (ray-worker))" in s.reasons
    assert not any(r.endswith("missing") for r in s.reasons)
    replaced = build_snapshot(raw, planned=[_plan("tpu-v6e-4x4-1", (
        *_running(1)[:3], PlannedHost(3, "pod-1-3", "Running", terminating=True)), replacing=True)])
    r = replaced.slice("tpu-v6e-4x4-1")
    assert r.state == "replacing" and r.reasons[0].startswith("KubeRay is replacing the slice")
    assert replaced.idle_slices("v6e-16") == [replaced.slice("tpu-v6e-4x4-0")]


def _plan_of(slices: int):
    return parse_raycluster(build_raycluster("c", [f"v6e:4x4 x{slices}", "v6e:2x2"], image="i:1"))


def test_planned_slices_from_pods() -> None:
    plan = _plan_of(2)
    pods = [worker_pod("c", GROUP, 0, h, multi_host=True) for h in range(4)]
    pods += [worker_pod("c", GROUP, 1, h, multi_host=True, phase="Failed") for h in range(1)]
    pods += [worker_pod("c", GROUP, 2, h, multi_host=True, terminating=True) for h in range(4)]
    pods.append(worker_pod("c", "tpu-v6e-2x2", 0, 0, multi_host=False, phase="Pending",
                           waiting="ErrImagePull"))
    by_name = {p.name: p for p in planned_slices(plan, pods)}
    assert list(by_name) == ["tpu-v6e-4x4-0", "tpu-v6e-4x4-1", "tpu-v6e-4x4-2", "tpu-v6e-2x2-0"]
    assert not by_name["tpu-v6e-4x4-0"].replacing
    assert by_name["tpu-v6e-4x4-1"].replacing            # a failed pod: recreated as a unit
    assert by_name["tpu-v6e-4x4-2"].replacing            # beyond replicas: scaling down
    single = by_name["tpu-v6e-2x2-0"]
    assert single.hosts[0].detail == "Pending: ErrImagePull (ray-worker): back-off 40s restarting"


def test_pods_without_index_labels_fill_free_slots() -> None:
    plan = _plan_of(1)
    pods = [worker_pod("c", GROUP, 0, h, multi_host=True) for h in range(4)]
    for p in pods:
        del p["metadata"]["labels"]["ray.io/worker-group-replica-index"]
    (first, _single) = planned_slices(plan, pods)
    assert [h.pod for h in first.hosts] == sorted(p["metadata"]["name"] for p in pods)


def test_pod_problem_texts() -> None:
    assert pod_problem(worker_pod("c", "g", 0, 0, multi_host=False)) == "Running"
    assert pod_problem(worker_pod("c", "g", 0, 0, multi_host=False, terminating=True)) == \
        "Running: terminating"
    long = worker_pod("c", "g", 0, 0, multi_host=False, phase="Pending", unschedulable="x" * 500)
    assert len(pod_problem(long)) == 200
    oom = {"status": {"phase": "Running", "containerStatuses": [
        {"name": "ray-worker", "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]}}
    assert pod_problem(oom) == "Running: OOMKilled (ray-worker, exit code 137)"
