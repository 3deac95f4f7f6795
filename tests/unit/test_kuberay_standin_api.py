"""The Kubernetes API paths of raytpu_lab, run against a local STAND-IN of the Kubernetes REST API.

No real Kubernetes cluster can be reached from these machines: every test here talks to
``tests/k8s_standin.py``, a small HTTP server that answers the real paths the official
``kubernetes`` client calls with JSON shaped like the KubeRay samples. What passes here is verified
against that stand-in only (request paths, verbs, content types, error mapping), not against a real
API server, KubeRay operator or GKE. No Ray is started.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import parse_qs

import pytest

from raytpu_lab.errors import KubernetesError, ManifestError, RaytpuError
from raytpu_lab.kuberay import build_raycluster, load_manifest, parse_raycluster
from raytpu_lab.kuberay.client import FIELD_MANAGER, KubeRayClient
from raytpu_lab.kuberay.connect import client_port, resolve
from raytpu_lab.kuberay.pods import planned_slices
from raytpu_lab.kuberay.status import readiness
from raytpu_lab.state.model import build_snapshot

from ..k8s_standin import (
    SECRETS,
    KubeStandIn,
    ready_status,
    running_standin,
    worker_pod,
    write_kubeconfig,
)
from .test_kuberay_manifests import SAMPLES

NS = "ml"


@pytest.fixture()
def standin() -> Iterator[KubeStandIn]:
    with running_standin() as s:
        yield s


@pytest.fixture()
def kubeconfig(standin: KubeStandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    path = write_kubeconfig(tmp_path / "config", standin.url, namespace=NS,
                            contexts=("standin", "other"))
    monkeypatch.setenv("KUBECONFIG", str(path))
    return path


@pytest.fixture()
def kube(kubeconfig: Path) -> KubeRayClient:
    return KubeRayClient.from_config()


def _v4_multihost() -> dict:
    (path,) = [p for p in SAMPLES if p.name == "ray-cluster.tpu-v4-multihost.yaml"]
    return load_manifest(path)


def _lab_manifest(slices: int = 2) -> dict:
    return build_raycluster("tpu-lab", [f"v6e:4x4 x{slices}", "v4:2x2x2"], image="img:2.60.0",
                            namespace=NS)


# --- reading ---------------------------------------------------------------------------------

def test_get_raycluster_and_plan(standin: KubeStandIn, kube: KubeRayClient) -> None:
    manifest = _v4_multihost()
    standin.add_raycluster(manifest, NS, ready_status(2))
    obj, plan = kube.plan(manifest["metadata"]["name"])
    assert obj["status"]["state"] == "ready"
    assert plan.expected_hosts == {"tpu-group-0": 2}
    assert standin.requests[-1][:2] == (
        "GET", f"/apis/ray.io/v1/namespaces/{NS}/rayclusters/raycluster-tpu-v4-multihost")
    assert kube.namespace == NS and kube.context == "standin"
    assert all(h == f"Bearer {SECRETS[0]}" for h in standin.auth_headers)


def test_list_pods_by_label_and_head_service(standin: KubeStandIn, kube: KubeRayClient) -> None:
    standin.add_raycluster(_lab_manifest(), NS, ready_status(9))
    standin.pods[NS] = [worker_pod("tpu-lab", "tpu-v4-2x2x2", 0, h, multi_host=True, namespace=NS)
                        for h in range(2)] + [worker_pod("someone-else", "g", 0, 0, multi_host=False,
                                                         namespace=NS)]
    pods = kube.list_pods("tpu-lab")
    assert [p["metadata"]["name"] for p in pods] == ["tpu-lab-tpu-v4-2x2x2-worker-r0h0",
                                                     "tpu-lab-tpu-v4-2x2x2-worker-r0h1"]
    method, path, query, _ = standin.requests[-1]
    assert (method, path) == ("GET", f"/api/v1/namespaces/{NS}/pods")
    assert parse_qs(query) == {"labelSelector": ["ray.io/cluster=tpu-lab"]}
    svc = kube.head_service(parse_raycluster(_lab_manifest()))
    assert svc["metadata"]["name"] == "tpu-lab-head-svc" and client_port(svc) == 10001
    assert standin.requests[-1][1] == f"/api/v1/namespaces/{NS}/services/tpu-lab-head-svc"


def test_status_conditions(standin: KubeStandIn, kube: KubeRayClient) -> None:
    standin.add_raycluster(_lab_manifest(), NS, ready_status(10, ready=6))
    r = readiness(kube.get_raycluster("tpu-lab"))
    assert r.head_ready and not r.provisioned and not r.workers_ready
    assert "6/10 worker pods ready" in r.explain()
    assert "RayClusterProvisioned=False (RayClusterPodsProvisioning)" in r.explain()
    standin.add_raycluster(_lab_manifest(), NS, ready_status(10))
    r = readiness(kube.get_raycluster("tpu-lab"))
    assert r.head_ready and r.provisioned and r.workers_ready and r.state == "ready"


def test_planned_slices_from_pods_feed_the_snapshot(standin: KubeStandIn, kube: KubeRayClient) -> None:
    standin.add_raycluster(_lab_manifest(), NS, ready_status(10, ready=2))
    pods = [worker_pod("tpu-lab", "tpu-v4-2x2x2", 0, h, multi_host=True, namespace=NS) for h in range(2)]
    pods += [worker_pod("tpu-lab", "tpu-v6e-4x4", 0, h, multi_host=True, namespace=NS, phase="Pending",
                        unschedulable="0/3 nodes are available: 3 Insufficient google.com/tpu.")
             for h in range(4)]
    pods += [worker_pod("tpu-lab", "tpu-v6e-4x4", 1, 0, multi_host=True, namespace=NS,
                        terminating=True),
             worker_pod("tpu-lab", "tpu-v6e-4x4", 1, 1, multi_host=True, namespace=NS)]
    standin.pods[NS] = pods
    obj, plan = kube.plan("tpu-lab")
    planned = planned_slices(plan, kube.list_pods("tpu-lab"))
    snap = build_snapshot({"nodes": [], "placement_groups": []}, planned=planned)
    by_name = {s.name: s for s in snap.slices}
    assert set(by_name) == {"tpu-v6e-4x4-0", "tpu-v6e-4x4-1", "tpu-v4-2x2x2-0"}
    pending = by_name["tpu-v6e-4x4-0"]
    assert pending.state == "provisioning" and [h.state for h in pending.hosts] == ["provisioning"] * 4
    assert "Unschedulable: 0/3 nodes are available: 3 Insufficient google.com/tpu." in pending.hosts[0].detail
    assert by_name["tpu-v6e-4x4-1"].state == "replacing"
    assert by_name["tpu-v4-2x2x2-0"].state == "provisioning"  # pods run, no Ray node joined yet


# --- changing --------------------------------------------------------------------------------

def test_apply_creates_then_updates_by_server_side_apply(standin: KubeStandIn, kube: KubeRayClient) -> None:
    created = kube.apply(_lab_manifest(1))
    assert created["metadata"]["namespace"] == NS
    method, path, query, ctype = standin.requests[-1]
    assert (method, path) == ("PATCH", f"/apis/ray.io/v1/namespaces/{NS}/rayclusters/tpu-lab")
    assert ctype == "application/apply-patch+yaml"
    assert f"fieldManager={FIELD_MANAGER}" in query and "force=true" in query
    updated = kube.apply(_lab_manifest(3))
    assert updated["spec"]["workerGroupSpecs"][0]["replicas"] == 3
    assert standin.rayclusters[(NS, "tpu-lab")]["metadata"]["generation"] == 2


def test_scale_patches_one_group_and_widens_bounds(standin: KubeStandIn, kube: KubeRayClient) -> None:
    standin.add_raycluster(_lab_manifest(2), NS, ready_status(10))
    _, notes = kube.scale("tpu-lab", "tpu-v4-2x2x2", 3)
    assert notes == ["maxReplicas raised from 1 to 3"]
    method, path, _, ctype = standin.requests[-1]
    assert (method, ctype) == ("PATCH", "application/json-patch+json")
    groups = standin.rayclusters[(NS, "tpu-lab")]["spec"]["workerGroupSpecs"]
    assert [(g["groupName"], g["replicas"], g["maxReplicas"]) for g in groups] == [
        ("tpu-v6e-4x4", 2, 2), ("tpu-v4-2x2x2", 3, 3)]
    _, notes = kube.scale("tpu-lab", "tpu-v6e-4x4", 0)
    assert notes == ["minReplicas lowered from 2 to 0"]
    with pytest.raises(KubernetesError, match="has no worker group 'nope'") as info:
        kube.scale("tpu-lab", "nope", 1)
    assert "tpu-v6e-4x4, tpu-v4-2x2x2" in str(info.value)


def test_delete(standin: KubeStandIn, kube: KubeRayClient) -> None:
    standin.add_raycluster(_lab_manifest(), NS, ready_status(10))
    kube.delete("tpu-lab")
    assert standin.requests[-1][:2] == ("DELETE", f"/apis/ray.io/v1/namespaces/{NS}/rayclusters/tpu-lab")
    assert (NS, "tpu-lab") not in standin.rayclusters


def test_lab_apply_scale_delete(standin: KubeStandIn, kubeconfig: Path, tmp_path: Path) -> None:
    from raytpu_lab.kuberay import dump_manifest
    from raytpu_lab.lab import Lab

    lab = Lab()
    path = tmp_path / "lab.yaml"
    path.write_text(dump_manifest(_lab_manifest(1)))
    assert lab.apply(path)["metadata"]["name"] == "tpu-lab"
    assert lab.scale("tpu-v6e-4x4", 2, name="tpu-lab") == ["maxReplicas raised from 1 to 2"]
    with pytest.raises(RaytpuError, match="not confirmed"):
        lab.delete_raycluster("tpu-lab")
    assert (NS, "tpu-lab") in standin.rayclusters
    assert lab.delete_raycluster("tpu-lab", yes=True) == "tpu-lab"
    assert (NS, "tpu-lab") not in standin.rayclusters
    with pytest.raises(RaytpuError, match="which RayCluster"):
        lab.scale("tpu-v6e-4x4", 1)


def test_apply_refuses_bad_manifests_before_sending(standin: KubeStandIn, kubeconfig: Path) -> None:
    from raytpu_lab.lab import Lab

    bad = _lab_manifest()
    bad["spec"]["workerGroupSpecs"][0]["numOfHosts"] = 1
    with pytest.raises(ManifestError, match="numOfHosts"):
        Lab().apply(bad)
    bad["spec"]["workerGroupSpecs"][0]["replica"] = 1
    with pytest.raises(ManifestError, match="CRD schema"):
        Lab().apply(bad)
    assert standin.requests == []


# --- connecting ------------------------------------------------------------------------------

def test_resolve_outside_the_cluster_needs_a_port_forward(standin: KubeStandIn, kubeconfig: Path) -> None:
    standin.add_raycluster(_lab_manifest(), NS, ready_status(10))
    standin.pods[NS] = [{"metadata": {"name": "tpu-lab-head-x", "namespace": NS, "labels": {
        "ray.io/cluster": "tpu-lab", "ray.io/node-type": "head"}}, "status": {"phase": "Running"}}]
    with pytest.raises(KubernetesError) as info:
        resolve("tpu-lab", port_forward=False)
    assert info.value.kind == "port-forward"
    assert "kubectl port-forward svc/tpu-lab-head-svc 10001:10001 -n ml" in str(info.value)
    # The library's own port-forward is refused (no such pod port in the stand-in): same instruction.
    with pytest.raises(KubernetesError) as info:
        resolve("tpu-lab")
    assert info.value.kind == "port-forward"
    assert "kubectl port-forward svc/tpu-lab-head-svc 10001:10001 -n ml" in str(info.value)
    assert any("/pods/head-pod/portforward" in r[1] for r in standin.requests)


def test_resolve_with_an_address_and_in_cluster(standin: KubeStandIn, kubeconfig: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    standin.add_raycluster(_lab_manifest(), NS, ready_status(10))
    target = resolve("tpu-lab", address="ray://127.0.0.1:10001")
    assert target.address == "ray://127.0.0.1:10001" and target.service == "tpu-lab-head-svc"
    assert [s.name for s in target.plan.expected_slices()] == [
        "tpu-v6e-4x4-0", "tpu-v6e-4x4-1", "tpu-v4-2x2x2-0"]
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    target = resolve("tpu-lab")
    assert target.address == "ray://tpu-lab-head-svc.ml.svc.cluster.local:10001"


# --- bad input: one clear error each, no secret anywhere ---------------------------------------

def _check_clear(err: RaytpuError) -> str:
    text = str(err)
    assert "Why:" in text and "What to do:" in text, text
    return text


def test_no_kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubernetesError) as info:
        KubeRayClient.from_config()
    assert info.value.kind == "no-kubeconfig"
    assert "gcloud container clusters get-credentials" in _check_clear(info.value)


def test_wrong_context(kubeconfig: Path) -> None:
    with pytest.raises(KubernetesError) as info:
        KubeRayClient.from_config(context="prod")
    assert info.value.kind == "context"
    assert "Contexts in" in _check_clear(info.value) and "standin, other" in str(info.value)


def test_rbac_forbidden(standin: KubeStandIn, kube: KubeRayClient) -> None:
    standin.add_raycluster(_lab_manifest(), NS, ready_status(10))
    standin.forbidden = {"get rayclusters"}
    with pytest.raises(KubernetesError) as info:
        kube.get_raycluster("tpu-lab")
    assert (info.value.kind, info.value.status) == ("forbidden", 403)
    text = _check_clear(info.value)
    assert 'cannot get resource "rayclusters" in API group "ray.io"' in text
    assert "kubectl auth can-i get rayclusters.ray.io -n ml" in text


def test_raycluster_not_found_lists_the_existing_ones(standin: KubeStandIn, kube: KubeRayClient) -> None:
    standin.add_raycluster(_lab_manifest(), NS, ready_status(10))
    with pytest.raises(KubernetesError) as info:
        kube.get_raycluster("tpu-lb")
    assert (info.value.kind, info.value.status) == ("not-found", 404)
    assert "RayClusters in 'ml': tpu-lab." in _check_clear(info.value)


def test_crd_not_installed(standin: KubeStandIn, kube: KubeRayClient) -> None:
    standin.crd_installed = False
    with pytest.raises(KubernetesError) as info:
        kube.get_raycluster("tpu-lab")
    assert info.value.kind == "crd-missing"
    assert "Install KubeRay" in _check_clear(info.value)
    assert kube.crd_installed() is False
    standin.crd_installed = True
    assert kube.crd_installed() is True


def test_head_not_ready(standin: KubeStandIn, kubeconfig: Path) -> None:
    standin.add_raycluster(_lab_manifest(), NS, ready_status(10, ready=0, head_ready=False))
    standin.pods[NS] = [{"metadata": {"name": "tpu-lab-head-abc", "namespace": NS, "labels": {
        "ray.io/cluster": "tpu-lab", "ray.io/node-type": "head"}},
        "status": {"phase": "Pending", "containerStatuses": [{"name": "ray-head", "state": {
            "waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}]}}]
    with pytest.raises(KubernetesError) as info:
        resolve("tpu-lab", address="ray://127.0.0.1:1")
    assert info.value.kind == "not-ready"
    text = _check_clear(info.value)
    assert "HeadPodReady=False (HeadPodNotFound: Head Pod not found)" in text
    assert "pod tpu-lab-head-abc: Pending: ImagePullBackOff (ray-head)" in text


def test_live_raycluster_breaking_the_numofhosts_rule(standin: KubeStandIn, kubeconfig: Path) -> None:
    bad = _lab_manifest()
    bad["spec"]["workerGroupSpecs"][1]["numOfHosts"] = 4
    standin.add_raycluster(bad, NS, ready_status(12))
    with pytest.raises(ManifestError) as info:
        resolve("tpu-lab", address="ray://127.0.0.1:1")
    assert "numOfHosts == 2" in _check_clear(info.value)


def test_wrong_token_and_unreachable(standin: KubeStandIn, kubeconfig: Path, tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "wrong", standin.url)
    path.write_text(path.read_text().replace(SECRETS[0], "expired-token-0000000000"))
    with pytest.raises(KubernetesError) as info:
        KubeRayClient.from_config(kubeconfig=str(path)).get_raycluster("x")
    assert info.value.status == 401 and "get-credentials" in _check_clear(info.value)
    dead = write_kubeconfig(tmp_path / "dead", "http://127.0.0.1:9")
    with pytest.raises(KubernetesError) as info:
        KubeRayClient.from_config(kubeconfig=str(dead)).get_raycluster("x")
    assert info.value.kind == "unreachable" and "127.0.0.1:9" in _check_clear(info.value)


def test_no_secret_in_errors_outputs_or_logs(standin: KubeStandIn, kubeconfig: Path,
                                             caplog: pytest.LogCaptureFixture,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    caplog.set_level(logging.DEBUG)
    texts: list[str] = []
    standin.add_raycluster(_lab_manifest(), NS, ready_status(10, head_ready=False))
    kube = KubeRayClient.from_config()
    attempts = [
        lambda: kube.get_raycluster("missing"),
        lambda: resolve("tpu-lab", address="ray://127.0.0.1:1"),
        lambda: KubeRayClient.from_config(context="nope"),
    ]
    standin_forbidding = [lambda: kube.list_pods("tpu-lab"), lambda: kube.get_service("tpu-lab-head-svc")]
    for attempt in attempts:
        with pytest.raises(RaytpuError) as info:
            attempt()
        texts += [str(info.value), repr(info.value), *info.value._render_traceback_()]
    standin.forbidden = {"list pods", "get services", "get rayclusters"}
    for attempt in [*standin_forbidding, attempts[0]]:
        with pytest.raises(RaytpuError) as info:
            attempt()
        texts += [str(info.value), repr(info.value)]
    standin.forbidden = set()
    standin.crd_installed = False
    with pytest.raises(KubernetesError) as info:
        kube.get_raycluster("tpu-lab")
    texts.append(str(info.value))
    captured = capsys.readouterr()
    everything = "\n".join([*texts, caplog.text, captured.out, captured.err, repr(kube.__dict__.keys())])
    assert standin.auth_headers and all(SECRETS[0] in h for h in standin.auth_headers)  # it was sent
    for secret in SECRETS:
        assert secret not in everything
    assert kube.scrub(f"x {SECRETS[0]} y") == "x *** y"


@contextmanager
def _echo_server() -> Iterator[int]:
    """A TCP echo server on a free local port (stands for the head pod's Ray Client port)."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        listener.close()


def _roundtrip(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(payload)
        got = b""
        while len(got) < len(payload):
            chunk = conn.recv(65536)
            if not chunk:
                break
            got += chunk
        return got


def test_library_port_forward_relays_through_the_standin(standin: KubeStandIn, kubeconfig: Path) -> None:
    """The WebSocket port-forward of the kubernetes client, relayed by our PortForward, against
    the stand-in's v4.channel.k8s.io framing (a real API server's kubelet relay is not exercised)."""
    standin.add_raycluster(_lab_manifest(), NS, ready_status(10))
    with _echo_server() as echo_port:
        standin.portforward_targets[(NS, "head-pod", 10001)] = ("127.0.0.1", echo_port)
        target = resolve("tpu-lab")
        try:
            assert target.port_forward is not None
            local = target.port_forward.local_port
            assert target.address == f"ray://127.0.0.1:{local}"
            assert _roundtrip(local, b"hello ray client") == b"hello ray client"
            big = bytes(range(256)) * 1024  # 256 KiB, several frames each way
            results: list[bytes] = []
            threads = [threading.Thread(target=lambda: results.append(_roundtrip(local, big)))
                       for _ in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert results == [big] * 3  # one stream per connection, in parallel
            # Plain API calls from another thread (the map's refresh) while streams open: the
            # client's portforward swaps call_api during setup, so streams need their own client.
            errors: list[BaseException] = []

            def refresh() -> None:
                for _ in range(30):
                    try:
                        target.client.get_raycluster("tpu-lab")
                        target.client.list_pods("tpu-lab")
                    except BaseException as err:  # noqa: BLE001 - collected for the assert
                        errors.append(err)

            poller = threading.Thread(target=refresh)
            poller.start()
            for _ in range(8):
                assert _roundtrip(local, b"ping") == b"ping"
            poller.join(30)
            assert errors == []
        finally:
            target.close()
    with pytest.raises(OSError):
        _roundtrip(local, b"x")
    forwards = [r for r in standin.requests if r[1].endswith("/pods/head-pod/portforward")]
    assert forwards and all(r[2] == "ports=10001" for r in forwards)


def test_planned_keeps_the_last_answer_through_an_api_blip(standin: KubeStandIn, kubeconfig: Path) -> None:
    standin.add_raycluster(_lab_manifest(), NS, ready_status(10))
    target = resolve("tpu-lab", address="ray://127.0.0.1:1")
    first = target.planned()
    assert [p.name for p in first] == ["tpu-v6e-4x4-0", "tpu-v6e-4x4-1", "tpu-v4-2x2x2-0"]
    standin.forbidden = {"list pods"}
    assert target.planned(max_age_s=0) == first  # stale but kept
    target._planned = (target._planned[0] - 120, first)  # older than the 60 s grace
    with pytest.raises(KubernetesError, match="403 Forbidden"):
        target.planned(max_age_s=0)


def test_down_while_on_kuberay_stops_no_local_emulator(monkeypatch: pytest.MonkeyPatch) -> None:
    from raytpu_lab.cluster import emulator
    from raytpu_lab.lab import Lab

    stopped: list[str] = []
    closed: list[bool] = []

    class _Local:
        name = "raytpu"

        def is_running(self) -> bool:
            return True

        def down(self) -> None:
            stopped.append(self.name)

    class _Target:
        def close(self) -> None:
            closed.append(True)

    monkeypatch.setattr(emulator, "find", lambda name=emulator.DEFAULT_NAME: _Local())
    lab = Lab()
    lab.kuberay = _Target()  # type: ignore[assignment]
    assert lab.down() is None
    assert stopped == [] and closed == [True] and lab.kuberay is None
    assert lab.down() is None  # a cluster this session did not start keeps running...
    assert lab.down("raytpu") == "raytpu"  # ...unless named
    assert stopped == ["raytpu"]


def test_down_stops_what_up_started_even_after_connecting_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    from raytpu_lab.cluster import emulator
    from raytpu_lab.lab import Lab

    stopped: list[str] = []

    class _Started:
        name = "tpu-lab"

        def is_running(self) -> bool:
            return True

        def down(self) -> None:
            stopped.append(self.name)

    monkeypatch.setattr(emulator, "find", lambda name=emulator.DEFAULT_NAME: None)
    lab = Lab()
    lab.connection.started = _Started()  # type: ignore[assignment]  # as after lab.up(manifest=...)
    lab.cluster = None  # connect_kuberay through a port-forward: the address is not the emulator's
    assert lab.down() == "tpu-lab" and stopped == ["tpu-lab"]
    assert lab.down() is None and stopped == ["tpu-lab"]  # idempotent
