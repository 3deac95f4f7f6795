"""A local port forwarded to a pod port, through the Kubernetes API (what ``kubectl port-forward`` does).

Uses the official client's ``kubernetes.stream.portforward`` (a WebSocket on
``/api/v1/namespaces/{ns}/pods/{pod}/portforward``, needs RBAC ``create`` on ``pods/portforward``).
One listening socket on ``127.0.0.1``; each accepted connection gets its own forwarding stream,
because one stream carries one connection (Ray Client opens a few).

Each stream is opened through its own ``ApiClient``: ``kubernetes.stream.portforward`` swaps the
client's ``call_api`` while it connects, so a shared client would send other threads' plain API
calls (e.g. the map's refresh) down the WebSocket path.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

from raytpu_lab.advice import Text
from raytpu_lab.errors import KubernetesError

__all__ = ["PortForward", "kubectl_port_forward_hint"]

_CHUNK = 65536


def kubectl_port_forward_hint(service: str, namespace: str, port: int = 10001,
                              context: str | None = None) -> str:
    """The exact ``kubectl port-forward`` command for a head service port."""
    ctx = f" --context {context}" if context else ""
    return f"kubectl port-forward svc/{service} {port}:{port} -n {namespace}{ctx}"


class PortForward:
    """``127.0.0.1:<local_port>`` -> ``<pod>:<remote_port>``, until :meth:`close`.

    Args:
        configuration: The ``kubernetes.client.Configuration`` to connect with.
        namespace: The pod's namespace.
        pod: The pod's name (the Ray head pod).
        remote_port: The port in the pod, e.g. 10001 (Ray Client).

    Attributes:
        local_port: The local port (chosen by the OS) once :meth:`start` returned.
    """

    def __init__(self, configuration: Any, namespace: str, pod: str, remote_port: int) -> None:
        self.configuration = configuration
        self.namespace = namespace
        self.pod = pod
        self.remote_port = remote_port
        self.local_port = 0
        self._listener: socket.socket | None = None
        self._closed = threading.Event()
        self._streams: list[Any] = []

    def _open_stream(self) -> Any:
        from kubernetes import client
        from kubernetes.stream import portforward

        core = client.CoreV1Api(client.ApiClient(self.configuration))  # one per stream, see above
        return portforward(core.connect_get_namespaced_pod_portforward, self.pod,
                           self.namespace, ports=str(self.remote_port))

    def start(self, *, check: bool = True, fix: Text = "") -> int:
        """Listen locally; with ``check``, open one stream first so failures show now.

        Args:
            check: Open (and close) one stream before listening.
            fix: The "what to do" of the error, e.g. the ``kubectl port-forward`` command.

        Returns:
            The local port.

        Raises:
            KubernetesError: ``kind="port-forward"``: the API server refused or does not speak the
                port-forward protocol (the message gives the ``kubectl port-forward`` command).
        """
        if check:
            try:
                stream = self._open_stream()
                stream.close()
            except Exception as err:  # the client raises ApiException, WebSocket and OS errors
                raise KubernetesError(
                    f"Could not port-forward to pod {self.pod!r} port {self.remote_port}.",
                    why=f"{type(err).__name__} from the Kubernetes port-forward stream (RBAC create "
                        "on pods/portforward is needed, and the API server must accept WebSockets).",
                    fix=fix or "Run kubectl port-forward yourself and connect to ray://127.0.0.1:PORT.",
                    kind="port-forward") from None
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        self._listener = listener
        self.local_port = listener.getsockname()[1]
        threading.Thread(target=self._accept, name=f"raytpu-port-forward-{self.local_port}",
                         daemon=True).start()
        return self.local_port

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            stream = self._open_stream()
        except Exception:  # noqa: BLE001 - this connection fails; the next one tries again
            conn.close()
            return
        self._streams.append(stream)
        remote = stream.socket(self.remote_port)
        remote.setblocking(True)

        def pump(src: Any, dst: Any) -> None:
            try:
                while True:
                    data = src.recv(_CHUNK)
                    if not data:
                        break
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                for s in (src, dst):
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)

        back = threading.Thread(target=pump, args=(remote, conn), daemon=True)
        back.start()
        pump(conn, remote)
        back.join(5)
        conn.close()
        with contextlib.suppress(Exception):
            stream.close()

    def close(self) -> None:
        """Stop listening and close every stream. Idempotent."""
        self._closed.set()
        if self._listener is not None:
            # shutdown first: close() alone leaves a thread blocked in accept() holding the socket.
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                self._listener.close()
        for stream in self._streams:
            with contextlib.suppress(Exception):
                stream.close()
        self._streams.clear()
