"""A RayCluster manifest run on the emulator: its own small cluster, built from the manifest.

Why not the shared session cluster of ``tests/integration/conftest.py``: this cluster must be
created *from a manifest* (group names, env, resources and labels come from it), which the session
cluster is not. It is small (one v4 2x2x2 slice of 2 hosts + one single-host v6e 2x2 slice: 3 TPU
hosts) and lives only for this module, which runs before the session cluster starts (pytest
collects ``kuberay/`` before the ``test_*.py`` files beside it) and disconnects at the end.

Every host is checked against the checklist of ``shared/kuberay/README.md``: the KubeRay layer-1
environment, ``RAY_NODE_TYPE_NAME=<group>``, ``TPU_NAME=<group>-<r>``, ``TPU_WORKER_ID``,
``TPU_ACCELERATOR_TYPE``, ``TPU_TOPOLOGY``, ``TPU_SKIP_MDS_QUERY``, ``TPU_WORKER_HOSTNAMES`` for
multi-host slices, and the labels / resources Ray derives from them. The Kubernetes half
(connect_kuberay, planned slices, scale) runs against the local Kubernetes API STAND-IN
(``tests/k8s_standin.py``), not a real cluster.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import ray

from raytpu_lab.cluster import emulator
from raytpu_lab.kuberay import GroupSpec, build_raycluster, dump_manifest, parse_group_spec
from raytpu_lab.lab import Lab
from raytpu_lab.tpu.topology import parse_spec

from ...k8s_standin import ready_status, running_standin, worker_pod, write_kubeconfig

pytestmark = pytest.mark.slow

NAME = "kr-test"
V6E_GROUP = "v6e-single"


def _manifest() -> dict:
    m = build_raycluster(NAME, [parse_group_spec("v4:2x2x2"), GroupSpec(parse_spec("v6e:2x2"), 1,
                                                                        name=V6E_GROUP)],
                         cpu="3", memory="2G", image="rayproject/ray:2.60.0-py311",
                         env={"JAX_PLATFORMS": "tpu,cpu", "MY_FLAG": "on"})
    for group in m["spec"]["workerGroupSpecs"]:
        env = group["template"]["spec"]["containers"][0]["env"]
        env[:0] = [{"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}]
        env.append({"name": "VBAR_CONTROL_SERVICE_URL", "value": "$(NODE_IP):8353"})
        env.append({"name": "MY_GROUP", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.labels['ray.io/group']"}}})
    v6e = m["spec"]["workerGroupSpecs"][1]
    v6e["labels"] = {"team": "ml"}
    v6e["resources"] = {"custom_accel": "2"}
    return m


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, shared_cluster) -> Iterator[Lab]:
    # `shared_cluster` only to wait for it: two clusters starting at once on this 2-core machine
    # make both miss Ray's fixed start-up waits. This manifest's own cluster starts after it.
    if ray.is_initialized():
        ray.shutdown()
    stale = emulator.find(NAME)
    if stale is not None:
        stale.down()
    path = tmp_path_factory.mktemp("manifest") / "kr-test.yaml"
    path.write_text(dump_manifest(_manifest()))
    session = Lab()
    session.up(manifest=path)
    try:
        yield session
    finally:
        session.down()
        if ray.is_initialized():
            ray.shutdown()


def _environ(pgid: int) -> dict[str, str]:
    """The environment of an emulated node's raylet (its process group is ``pgid``)."""
    for proc in psutil.process_iter(["name"]):
        try:
            if proc.info["name"] == "raylet" and os.getpgid(proc.pid) == pgid:
                return proc.environ()
        except (psutil.Error, OSError):
            continue
    raise AssertionError(f"no raylet in process group {pgid}")


EXPECTED = {  # slice -> (group, pod type, topology, hosts, chips per host)
    "tpu-v4-2x2x2-0": ("tpu-v4-2x2x2", "v4-16", "2x2x2", 2, 4),
    f"{V6E_GROUP}-0": (V6E_GROUP, "v6e-4", "2x2", 1, 4),
}


def test_same_groups_slices_and_hosts(lab: Lab) -> None:
    cluster = lab.cluster
    assert cluster is not None and cluster.name == NAME
    assert cluster.expected_hosts == {s: e[3] for s, e in EXPECTED.items()}
    assert sorted((h.group, h.slice_name, h.worker_id) for h in cluster.hosts) == [
        ("tpu-v4-2x2x2", "tpu-v4-2x2x2-0", 0), ("tpu-v4-2x2x2", "tpu-v4-2x2x2-0", 1),
        (V6E_GROUP, f"{V6E_GROUP}-0", 0)]
    snap = lab.snapshot()
    assert {s.name: (s.pod_type, s.health, s.state) for s in snap.slices} == {
        s: (e[1], "intact", "free") for s, e in EXPECTED.items()}


def test_every_host_env_matches_the_readme_checklist(lab: Lab) -> None:
    assert lab.cluster is not None
    gcs_port = lab.cluster.address.rsplit(":", 1)[1]
    for host in lab.cluster.hosts:
        group, pod_type, topology, hosts, _ = EXPECTED[host.slice_name]
        env = _environ(host.pid)
        replica = int(host.slice_name.rsplit("-", 1)[1])
        # layer 1: KubeRay operator
        assert env["RAY_CLUSTER_NAME"] == NAME and env["RAY_CLUSTER_NAMESPACE"] == "default"
        assert env["RAY_NODE_TYPE_NAME"] == group
        assert env["RAY_IP"] == f"{NAME}-head-svc" and env["FQ_RAY_IP"] == "127.0.0.1"
        assert env["RAY_PORT"] == gcs_port and env["RAY_ADDRESS"] == f"127.0.0.1:{gcs_port}"
        assert env["RAY_CLOUD_INSTANCE_ID"].startswith(f"{NAME}-{group}-worker-")
        assert env["RAY_USAGE_STATS_KUBERAY_IN_USE"] == "1"
        assert env["RAY_DASHBOARD_ENABLE_K8S_DISK_USAGE"] == "1"
        assert env["KUBERAY_GEN_RAY_START_CMD"].startswith("ray start --address=")
        # layers 2 and 3: GKE device plugin and the KubeRay TPU webhook
        assert env["TPU_NAME"] == f"{group}-{replica}" == host.slice_name
        assert env["TPU_WORKER_ID"] == str(host.worker_id)
        assert env["TPU_ACCELERATOR_TYPE"] == pod_type and env["TPU_TOPOLOGY"] == topology
        assert env["TPU_SKIP_MDS_QUERY"] == "true"
        if hosts > 1:
            assert env["TPU_WORKER_HOSTNAMES"] == ",".join(
                f"{group}-{replica}-{h}.{NAME}-headless" for h in range(hosts))
        else:
            assert env["TPU_WORKER_HOSTNAMES"] == "localhost"
        # the manifest's container env, resolved as the kubelet would
        # status.hostIP is the host's own address, as on GKE
        assert env["MY_FLAG"] == "on" and env["NODE_IP"] == host.ip
        assert env["VBAR_CONTROL_SERVICE_URL"] == f"{host.ip}:8353"
        assert env["MY_GROUP"] == group
        # the emulator runs JAX on CPU whatever the manifest says
        assert env["JAX_PLATFORMS"] == "cpu"


def test_labels_and_resources_as_ray_derives_them_on_gke(lab: Lab) -> None:
    assert lab.cluster is not None
    nodes = [n for n in ray.nodes() if n["Alive"] and n["Labels"].get("ray.io/tpu-slice-name")]
    assert len(nodes) == 3
    for node in nodes:
        labels, res = node["Labels"], node["Resources"]
        slice_name = labels["ray.io/tpu-slice-name"]
        group, pod_type, topology, _, chips = EXPECTED[slice_name]
        worker = int(labels["ray.io/tpu-worker-id"])
        assert labels["ray.io/node-group"] == group
        assert labels["ray.io/tpu-pod-type"] == pod_type
        assert labels["ray.io/tpu-topology"] == topology
        assert labels["ray.io/accelerator-type"] == f"TPU-{pod_type.split('-')[0].upper()}"
        assert res["TPU"] == chips and res[slice_name] == 1
        assert res["CPU"] == 3 and res["memory"] == 2 * 10**9  # --num-cpus / --memory from limits
        assert (f"TPU-{pod_type}-head" in res) == (worker == 0)
        if group == V6E_GROUP:
            assert labels["team"] == "ml" and res["custom_accel"] == 2
        else:
            assert "team" not in labels and "custom_accel" not in res


def test_connect_kuberay_plans_from_the_standin(lab: Lab, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """connect_kuberay against the Kubernetes API stand-in serving the same manifest, with the
    emulator's GCS address in place of a port-forward; then a scale-up shows a provisioning slice."""
    assert lab.cluster is not None
    cluster = lab.cluster
    with running_standin() as standin:
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "config", standin.url)))
        standin.add_raycluster(copy.deepcopy(_manifest()), "default", ready_status(3))
        standin.pods["default"] = [
            worker_pod(NAME, h.group, int(h.slice_name.rsplit("-", 1)[1]), h.worker_id,
                       multi_host=h.group != V6E_GROUP) for h in cluster.hosts]
        target = lab.connect_kuberay(NAME, address=cluster.address)
        try:
            assert lab.kuberay is target and lab.cluster == cluster
            snap = lab.snapshot()
            assert {s.name: (s.state, s.group) for s in snap.slices} == {
                "tpu-v4-2x2x2-0": ("free", "tpu-v4-2x2x2"), f"{V6E_GROUP}-0": ("free", V6E_GROUP)}
            assert lab.scale(V6E_GROUP, 2) == ["maxReplicas raised from 1 to 2"]
            snap = lab.snapshot()
            new = snap.slice(f"{V6E_GROUP}-1")
            assert new.state == "provisioning" and new.hosts[0].detail == "pod not created yet"
            assert snap.slice(f"{V6E_GROUP}-0").state == "free"
            assert snap.idle_slices("v6e-4") == [snap.slice(f"{V6E_GROUP}-0")]
        finally:
            lab.kube.drop()
