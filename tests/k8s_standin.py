"""A local STAND-IN for the Kubernetes REST API, for tests only (no real cluster is reachable here).

It is not Kubernetes: a small threaded HTTP server that answers the real paths the official
``kubernetes`` client calls for a RayCluster, with JSON shaped like the KubeRay samples and the
Kubernetes API (``Status`` objects for errors):

- ``GET/PATCH/POST/DELETE /apis/ray.io/v1/namespaces/{ns}/rayclusters[/{name}]`` (PATCH: JSON patch
  with ``test``/``replace``/``add``, merge patch, server-side apply);
- ``GET /api/v1/namespaces/{ns}/pods?labelSelector=k=v[,k=v]``;
- ``GET /api/v1/namespaces/{ns}/services/{name}``;
- ``GET /apis/apiextensions.k8s.io/v1/customresourcedefinitions/rayclusters.ray.io``;
- ``GET /api/v1/namespaces/{ns}/pods/{pod}/portforward?ports=P`` upgraded to a WebSocket speaking
  the ``v4.channel.k8s.io`` port-forward framing (channel byte, initial port frames), relayed to a
  local TCP address registered in ``portforward_targets[(ns, pod, port)]``.

Failure modes tests switch on: ``forbidden`` (403 ``Status`` naming the verb and resource),
``crd_installed = False`` (404 "404 page not found", as an API server answers for an unknown
resource), a missing object (404 ``Status`` ``NotFound``) and a wrong bearer token (401).
It records each request line (method, path, query, content type) in ``requests``, and every
``Authorization`` header it saw in ``auth_headers``, so tests can check what the client sent.

:func:`write_kubeconfig` writes a kubeconfig pointing at it with a fake token and fake client
certificate data (plain HTTP: the stand-in does no TLS, so the certificate is loaded but unused).
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import socket
import struct
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

FAKE_TOKEN = "standin-token-7f3a9c1e5b2d4f60a8e1c3b5d7f9a1c3"
FAKE_CERT = ("-----BEGIN CERTIFICATE-----\nMIIBstandinFAKECERTIFICATEDATAstandin0123456789abcdefXYZ\n"
             "-----END CERTIFICATE-----\n")
FAKE_KEY = ("-----BEGIN PRIVATE KEY-----\nMIIEstandinFAKEPRIVATEKEYDATAstandin0123456789abcdefQRS\n"
            "-----END PRIVATE KEY-----\n")
SECRETS = (FAKE_TOKEN, FAKE_CERT.splitlines()[1], FAKE_KEY.splitlines()[1],
           base64.b64encode(FAKE_CERT.encode()).decode(), base64.b64encode(FAKE_KEY.encode()).decode())
"""Everything a test must never find in an output, a log or an exception."""

_RC = "/apis/ray.io/v1/namespaces/"
_CRD = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/rayclusters.ray.io"


def _status(code: int, reason: str, message: str, details: dict | None = None) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "details": details or {}, "code": code}


class KubeStandIn:
    """State and server of the stand-in. Use :func:`running_standin`."""

    def __init__(self) -> None:
        self.rayclusters: dict[tuple[str, str], dict] = {}
        self.pods: dict[str, list[dict]] = {}
        self.services: dict[tuple[str, str], dict] = {}
        self.crd_installed = True
        self.forbidden: set[str] = set()  # e.g. {"get rayclusters", "list pods"}
        self.portforward_targets: dict[tuple[str, str, int], tuple[str, int]] = {}
        self.requests: list[tuple[str, str, str, str]] = []
        self.auth_headers: list[str] = []
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    # -- fixtures -------------------------------------------------------------------------------

    def add_raycluster(self, manifest: Mapping[str, Any], namespace: str = "default",
                       status: Mapping[str, Any] | None = None) -> dict:
        obj = copy.deepcopy(dict(manifest))
        obj.setdefault("metadata", {})["namespace"] = namespace
        obj["metadata"].setdefault("uid", f"uid-{obj['metadata']['name']}")
        obj["metadata"].setdefault("generation", 1)
        obj["metadata"].setdefault("resourceVersion", "1")
        if status is not None:
            obj["status"] = copy.deepcopy(dict(status))
        self.rayclusters[(namespace, obj["metadata"]["name"])] = obj
        name = obj["metadata"]["name"]
        self.services[(namespace, f"{name}-head-svc")] = head_service(name, namespace)
        return obj

    # -- HTTP -----------------------------------------------------------------------------------

    def handle(self, method: str, raw_path: str, headers: Mapping[str, str], body: bytes
               ) -> tuple[int, Any]:
        parts = urlsplit(raw_path)
        path, query = parts.path, parse_qs(parts.query)
        with self.lock:
            self.requests.append((method, path, parts.query, headers.get("Content-Type", "")))
            self.auth_headers.append(headers.get("Authorization", ""))
        if headers.get("Authorization") != f"Bearer {FAKE_TOKEN}":
            return 401, _status(401, "Unauthorized", "Unauthorized")
        if path == _CRD:
            if "get customresourcedefinitions" in self.forbidden:
                return 403, self._forbidden("get", "customresourcedefinitions", "apiextensions.k8s.io", "")
            if not self.crd_installed:
                return 404, _status(404, "NotFound", 'customresourcedefinitions.apiextensions.k8s.io '
                                    '"rayclusters.ray.io" not found',
                                    {"name": "rayclusters.ray.io", "group": "apiextensions.k8s.io",
                                     "kind": "customresourcedefinitions"})
            return 200, {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                         "metadata": {"name": "rayclusters.ray.io"},
                         "spec": {"group": "ray.io", "names": {"plural": "rayclusters"}}}
        if path.startswith(_RC):
            return self._rayclusters(method, path[len(_RC):].split("/"), headers, body)
        segs = path.split("/")
        if path.startswith("/api/v1/namespaces/") and len(segs) >= 6:
            ns, kind = segs[4], segs[5]
            if kind == "pods" and len(segs) == 6 and method == "GET":
                if "list pods" in self.forbidden:
                    return 403, self._forbidden("list", "pods", "", ns)
                selector = dict(s.split("=", 1) for s in (query.get("labelSelector") or [""])[0].split(",") if s)
                items = [p for p in self.pods.get(ns, []) if all(
                    (p["metadata"].get("labels") or {}).get(k) == v for k, v in selector.items())]
                return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "1"},
                             "items": copy.deepcopy(items)}
            if kind == "services" and len(segs) == 7 and method == "GET":
                if "get services" in self.forbidden:
                    return 403, self._forbidden("get", "services", "", ns)
                svc = self.services.get((ns, segs[6]))
                if svc is None:
                    return 404, _status(404, "NotFound", f'services "{segs[6]}" not found',
                                        {"name": segs[6], "kind": "services"})
                return 200, copy.deepcopy(svc)
        return 404, "404 page not found"

    def _forbidden(self, verb: str, resource: str, group: str, ns: str, name: str = "") -> dict:
        res = f"{resource}.{group}" if group else resource
        where = f' in the namespace "{ns}"' if ns else " at the cluster scope"
        return _status(403, "Forbidden",
                       f'{res}{" " + repr(name).replace(chr(39), chr(34)) if name else ""} is forbidden: '
                       f'User "system:serviceaccount:{ns or "default"}:notebook" cannot {verb} resource '
                       f'"{resource}" in API group "{group}"{where}',
                       {"name": name, "group": group, "kind": resource})

    def _rayclusters(self, method: str, segs: list[str], headers: Mapping[str, str], body: bytes
                     ) -> tuple[int, Any]:
        if not self.crd_installed:
            return 404, "404 page not found"
        ns = segs[0]
        if len(segs) < 2 or segs[1] != "rayclusters":
            return 404, "404 page not found"
        name = segs[2] if len(segs) > 2 else ""
        verb = {"GET": "get" if name else "list", "POST": "create", "PATCH": "patch",
                "DELETE": "delete"}.get(method, method.lower())
        if f"{verb} rayclusters" in self.forbidden:
            return 403, self._forbidden(verb, "rayclusters", "ray.io", ns, name)
        key = (ns, name)
        not_found = (404, _status(404, "NotFound", f'rayclusters.ray.io "{name}" not found',
                                  {"name": name, "group": "ray.io", "kind": "rayclusters"}))
        with self.lock:
            if method == "GET" and not name:
                items = [copy.deepcopy(v) for (n, _), v in sorted(self.rayclusters.items()) if n == ns]
                return 200, {"apiVersion": "ray.io/v1", "kind": "RayClusterList", "items": items,
                             "metadata": {"resourceVersion": "1"}}
            if method == "POST":
                obj = json.loads(body)
                key = (ns, obj["metadata"]["name"])
                if key in self.rayclusters:
                    return 409, _status(409, "AlreadyExists", f'rayclusters.ray.io "{key[1]}" already exists')
                return 201, self.add_raycluster(obj, ns)
            if method == "PATCH" and headers.get("Content-Type", "").startswith("application/apply-patch"):
                obj = yaml.safe_load(body)
                if key in self.rayclusters:
                    stored = self.rayclusters[key]
                    stored["spec"] = obj.get("spec")
                    stored["metadata"]["generation"] += 1
                    return 200, copy.deepcopy(stored)
                return 201, copy.deepcopy(self.add_raycluster(obj, ns))
            if key not in self.rayclusters:
                return not_found
            stored = self.rayclusters[key]
            if method == "GET":
                return 200, copy.deepcopy(stored)
            if method == "DELETE":
                del self.rayclusters[key]
                self.services.pop((ns, f"{name}-head-svc"), None)
                return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success",
                             "details": {"name": name, "group": "ray.io", "kind": "rayclusters",
                                         "uid": stored["metadata"].get("uid")}}
            if method == "PATCH":
                patch = json.loads(body)
                kind = headers.get("Content-Type", "")
                updated = copy.deepcopy(stored)
                if kind.startswith("application/json-patch"):
                    for op in patch:
                        ok = _json_patch(updated, op)
                        if not ok:
                            return 422, _status(422, "Invalid", f"the server rejected our request due "
                                                f"to an error in our request: test failed at {op['path']}")
                else:  # merge patch
                    _merge(updated, patch)
                updated["metadata"]["generation"] += 1
                self.rayclusters[key] = updated
                return 200, copy.deepcopy(updated)
        return 405, _status(405, "MethodNotAllowed", "method not allowed")


def _pointer(doc: Any, path: str) -> tuple[Any, str]:
    parts = [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]
    for p in parts[:-1]:
        doc = doc[int(p)] if isinstance(doc, list) else doc[p]
    return doc, parts[-1]


def _json_patch(doc: dict, op: Mapping[str, Any]) -> bool:
    parent, last = _pointer(doc, op["path"])
    index: Any = int(last) if isinstance(parent, list) else last
    if op["op"] == "test":
        try:
            return bool(parent[index] == op["value"])
        except (KeyError, IndexError):
            return False
    if op["op"] in ("replace", "add"):
        parent[index] = op["value"]
        return True
    if op["op"] == "remove":
        del parent[index]
        return True
    return False


def _merge(target: dict, patch: Mapping[str, Any]) -> None:
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, Mapping) and isinstance(target.get(k), dict):
            _merge(target[k], v)
        else:
            target[k] = copy.deepcopy(v)


_WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def _ws_frame(payload: bytes, opcode: int = 0x2) -> bytes:
    head = bytes([0x80 | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([n])
    elif n < 65536:
        head += bytes([126]) + struct.pack("!H", n)
    else:
        head += bytes([127]) + struct.pack("!Q", n)
    return head + payload


def _ws_read(rfile: Any) -> tuple[int, bytes] | None:
    head = rfile.read(2)
    if len(head) < 2:
        return None
    opcode, n = head[0] & 0x0F, head[1] & 0x7F
    if n == 126:
        n = struct.unpack("!H", rfile.read(2))[0]
    elif n == 127:
        n = struct.unpack("!Q", rfile.read(8))[0]
    mask = rfile.read(4) if head[1] & 0x80 else b"\0\0\0\0"
    data = rfile.read(n)
    return opcode, bytes(b ^ mask[i % 4] for i, b in enumerate(data))


class _Handler(BaseHTTPRequestHandler):
    standin: KubeStandIn

    def _portforward(self, headers: dict[str, str]) -> bool:
        """Serve a port-forward WebSocket; ``False`` if this request is not one."""
        parts = urlsplit(self.path)
        segs = parts.path.split("/")
        if not (len(segs) == 8 and segs[:4] == ["", "api", "v1", "namespaces"] and segs[5] == "pods"
                and segs[7] == "portforward" and headers.get("Upgrade", "").lower() == "websocket"):
            return False
        standin: KubeStandIn = self.server.standin  # type: ignore[attr-defined]
        standin.requests.append(("GET", parts.path, parts.query, ""))
        standin.auth_headers.append(headers.get("Authorization", ""))
        port = int((parse_qs(parts.query).get("ports") or ["0"])[0])
        target = standin.portforward_targets.get((segs[4], segs[6], port))
        if headers.get("Authorization") != f"Bearer {FAKE_TOKEN}" or target is None:
            code = 401 if target is not None else 404
            body = json.dumps(_status(code, "NotFound" if code == 404 else "Unauthorized",
                                      f'pods "{segs[6]}" not found')).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return True
        accept = base64.b64encode(hashlib.sha1(
            (headers["Sec-Websocket-Key"] + _WS_GUID).encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.send_header("Sec-WebSocket-Protocol", "v4.channel.k8s.io")
        self.end_headers()
        port_bytes = struct.pack("<H", port)
        self.wfile.write(_ws_frame(b"\x00" + port_bytes) + _ws_frame(b"\x01" + port_bytes))
        upstream = socket.create_connection(target)
        lock = threading.Lock()

        def back() -> None:  # target -> client, on data channel 0
            try:
                while data := upstream.recv(65536):
                    with lock:
                        self.wfile.write(_ws_frame(b"\x00" + data))
            except OSError:
                pass
            with lock:
                try:
                    self.wfile.write(_ws_frame(b"", 0x8))
                except OSError:
                    pass

        threading.Thread(target=back, daemon=True).start()
        try:
            while (frame := _ws_read(self.rfile)) is not None:
                opcode, payload = frame
                if opcode == 0x8:
                    break
                if opcode == 0x2 and payload[:1] == b"\x00" and len(payload) > 1:
                    upstream.sendall(payload[1:])
        except OSError:
            pass
        finally:
            upstream.close()
        self.close_connection = True
        return True

    def _serve(self) -> None:
        headers = {k.title(): v for k, v in self.headers.items()}
        if self.command == "GET" and self._portforward(headers):
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        code, payload = self.server.standin.handle(  # type: ignore[attr-defined]
            self.command, self.path, headers, body)
        data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain" if isinstance(payload, str) else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _serve

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        return


@contextmanager
def running_standin() -> Iterator[KubeStandIn]:
    """Start the stand-in on a free local port; stop it afterwards."""
    standin = KubeStandIn()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.standin = standin  # type: ignore[attr-defined]
    server.daemon_threads = True
    standin.server = server
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              name="k8s-standin", daemon=True)
    thread.start()
    try:
        yield standin
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def write_kubeconfig(path: Path, url: str, *, namespace: str = "default",
                     contexts: tuple[str, ...] = ("standin",)) -> Path:
    """A kubeconfig for the stand-in: fake bearer token and fake client certificate data."""
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": contexts[0],
        "clusters": [{"name": "standin-cluster", "cluster": {"server": url}}],
        "users": [{"name": "standin-user", "user": {
            "token": FAKE_TOKEN,
            "client-certificate-data": base64.b64encode(FAKE_CERT.encode()).decode(),
            "client-key-data": base64.b64encode(FAKE_KEY.encode()).decode()}}],
        "contexts": [{"name": c, "context": {"cluster": "standin-cluster", "user": "standin-user",
                                             "namespace": namespace}} for c in contexts],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def head_service(cluster: str, namespace: str) -> dict:
    """``<cluster>-head-svc`` as KubeRay creates it (headless ClusterIP, named ports)."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": f"{cluster}-head-svc", "namespace": namespace,
                         "labels": {"ray.io/cluster": cluster, "ray.io/node-type": "head"}},
            "spec": {"clusterIP": "None", "type": "ClusterIP",
                     "selector": {"ray.io/cluster": cluster, "ray.io/node-type": "head"},
                     "ports": [{"name": n, "port": p, "protocol": "TCP", "targetPort": p} for n, p in
                               (("gcs-server", 6379), ("dashboard", 8265), ("client", 10001),
                                ("serve", 8000))]}}


def ready_status(desired: int, ready: int | None = None, head_ready: bool = True) -> dict:
    """``.status`` of a RayCluster as KubeRay writes it."""
    ready = desired if ready is None else ready
    t = "2026-11-30T12:00:00Z"
    return {
        "state": "ready" if head_ready and ready == desired else "",
        "desiredWorkerReplicas": desired, "readyWorkerReplicas": ready,
        "availableWorkerReplicas": ready, "observedGeneration": 1,
        "conditions": [
            {"type": "HeadPodReady", "status": "True" if head_ready else "False",
             "reason": "HeadPodRunningAndReady" if head_ready else "HeadPodNotFound",
             "message": "" if head_ready else "Head Pod not found", "lastTransitionTime": t},
            {"type": "RayClusterProvisioned", "status": "True" if ready == desired else "False",
             "reason": "AllPodRunningAndReadyFirstTime" if ready == desired else "RayClusterPodsProvisioning",
             "message": "", "lastTransitionTime": t}],
        "endpoints": {"client": "10001", "dashboard": "8265", "gcs-server": "6379"},
        "head": {"podName": "head-pod", "serviceName": "head-svc"},
    }


def worker_pod(cluster: str, group: str, replica: int, host: int, *, multi_host: bool,
               namespace: str = "default", phase: str = "Running", waiting: str = "",
               unschedulable: str = "", terminating: bool = False) -> dict:
    """A TPU worker pod as KubeRay labels it (``RayMultiHostIndexing`` on)."""
    labels = {"ray.io/cluster": cluster, "ray.io/group": group, "ray.io/node-type": "worker",
              "ray.io/is-ray-node": "yes", "app.kubernetes.io/name": "kuberay",
              "app.kubernetes.io/created-by": "kuberay-operator",
              "ray.io/worker-group-replica-index": str(replica)}
    if multi_host:
        labels["ray.io/replica-host-index"] = str(host)
        labels["ray.io/worker-group-replica-name"] = f"{group}-abcd{replica}"
    status: dict[str, Any] = {"phase": phase}
    if unschedulable:
        status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                 "message": unschedulable}]
    if waiting:
        status["containerStatuses"] = [{"name": "ray-worker", "ready": False, "restartCount": 3,
                                        "state": {"waiting": {"reason": waiting,
                                                              "message": "back-off 40s restarting"}}}]
    meta: dict[str, Any] = {"name": f"{cluster}-{group}-worker-r{replica}h{host}", "namespace": namespace,
                            "labels": labels}
    if terminating:
        meta["deletionTimestamp"] = "2026-11-30T12:01:00Z"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "ray-worker", "image": "rayproject/ray:2.60.0"}]},
            "status": status}
