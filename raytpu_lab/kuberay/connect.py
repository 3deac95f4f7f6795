"""Find a RayCluster on Kubernetes and work out how to reach its head from this process.

:func:`resolve` reads the RayCluster, derives its expected slices, checks readiness from the status
conditions (``HeadPodReady``), finds the head service (``<cluster>-head-svc``: 6379 GCS, 8265
dashboard, 10001 Ray Client) and picks the Ray address:

- an explicit ``address`` (e.g. after your own ``kubectl port-forward``) as given;
- inside the cluster (a notebook pod): ``ray://<svc>.<ns>.svc.cluster.local:<client port>``;
- outside: a port-forward to the head pod's client port set up here
  (:class:`raytpu_lab.kuberay.portforward.PortForward`), ``ray://127.0.0.1:<local port>``; when that
  is refused, a :class:`~raytpu_lab.errors.KubernetesError` gives the exact ``kubectl port-forward``.

The resulting :class:`KubeRayTarget` also feeds the state model: :meth:`KubeRayTarget.planned`
(RayCluster + pods, cached for a few seconds) -> ``build_snapshot(..., planned=...)``.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from raytpu_lab.advice import Text, cmd
from raytpu_lab.errors import KubernetesError
from raytpu_lab.kuberay.client import KubeRayClient
from raytpu_lab.kuberay.groups import RayClusterPlan, parse_raycluster
from raytpu_lab.kuberay.pods import planned_slices, pod_problem
from raytpu_lab.kuberay.portforward import PortForward, kubectl_port_forward_hint
from raytpu_lab.kuberay.status import Readiness, readiness
from raytpu_lab.state.planned import PlannedSlice

__all__ = ["KubeRayTarget", "resolve", "client_port"]

_PLANNED_MAX_AGE_S = 3.0
_PLANNED_STALE_S = 60.0  # how long a failing API server may leave the last plan in use


def client_port(service: dict[str, Any]) -> int:
    """The Ray Client port of a head service: the port named ``client``, else 10001."""
    for port in (service.get("spec") or {}).get("ports") or []:
        if port.get("name") == "client":
            return int(port.get("port") or 10001)
    return 10001


@dataclass
class KubeRayTarget:
    """A RayCluster this session is connected to.

    Attributes:
        client: The Kubernetes client.
        name: RayCluster name.
        namespace: Its namespace.
        plan: Worker groups and expected slices (refreshed by :meth:`planned`).
        readiness: Its status when last read.
        address: The Ray address used.
        service: The head service's name.
        port_forward: The port-forward set up for it, or ``None``.
    """

    client: KubeRayClient
    name: str
    namespace: str
    plan: RayClusterPlan
    readiness: Readiness
    address: str
    service: str
    port_forward: PortForward | None = None
    _planned: tuple[float, list[PlannedSlice]] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def planned(self, max_age_s: float = _PLANNED_MAX_AGE_S) -> list[PlannedSlice]:
        """Expected slices with their pods' state, read at most every ``max_age_s`` seconds.

        When the API server fails, the last answer is kept for up to 60 s.

        Raises:
            KubernetesError: As :meth:`KubeRayClient.get_raycluster` / ``list_pods``, when
                there is no answer younger than 60 s.
        """
        with self._lock:
            now = time.monotonic()
            if self._planned is None or now - self._planned[0] > max_age_s:
                try:
                    obj = self.client.get_raycluster(self.name, self.namespace)
                    pods = self.client.list_pods(self.name, self.namespace)
                except KubernetesError:
                    # A blip of the API server should not blank the Ray view: keep the last
                    # answer for a while, then let the error show.
                    if self._planned is not None and now - self._planned[0] < _PLANNED_STALE_S:
                        return self._planned[1]
                    raise
                self.plan = parse_raycluster(obj, source=f"RayCluster {self.name}")
                self.readiness = readiness(obj)
                self._planned = (now, planned_slices(self.plan, pods))
            return self._planned[1]

    def forget_plan(self) -> None:
        """Read the RayCluster again on the next :meth:`planned` (after it was scaled)."""
        with self._lock:
            self._planned = None

    def close(self) -> None:
        """Stop the port-forward, if any."""
        if self.port_forward is not None:
            self.port_forward.close()
            self.port_forward = None


def _head_pod(client: KubeRayClient, obj: dict[str, Any], name: str, namespace: str
              ) -> tuple[str, list[dict[str, Any]]]:
    pods = client.list_pods(name, namespace)
    heads = [p for p in pods if ((p.get("metadata") or {}).get("labels") or {}).get(
        "ray.io/node-type") == "head"]
    named = ((obj.get("status") or {}).get("head") or {}).get("podName")
    pod = named or (str(heads[0]["metadata"]["name"]) if heads else "")
    return pod, heads


def resolve(name: str, *, namespace: str | None = None, context: str | None = None,
            kubeconfig: str | None = None, address: str | None = None,
            port_forward: bool = True, client: KubeRayClient | None = None) -> KubeRayTarget:
    """Read RayCluster ``name`` and decide the Ray address (see the module docstring).

    Raises:
        KubernetesError: Config, RBAC, not found, CRD missing (see :class:`KubeRayClient`);
            ``kind="not-ready"`` when ``HeadPodReady`` is not true (with the head pod's reason);
            ``kind="port-forward"`` when the port-forward cannot be set up (gives the kubectl
            command).
        ManifestError: The live RayCluster breaks the TPU rules (e.g. a numOfHosts the webhook
            would refuse), since its slices cannot be derived.
    """
    client = client or KubeRayClient.from_config(context=context, namespace=namespace,
                                                 kubeconfig=kubeconfig)
    ns = namespace or client.namespace
    obj = client.get_raycluster(name, ns)
    plan = parse_raycluster(obj, source=f"RayCluster {name}")
    ready = readiness(obj)
    service = plan.service_name
    if not ready.head_ready:
        pod, heads = _head_pod(client, obj, name, ns)
        detail = "; ".join(f"pod {h['metadata']['name']}: {pod_problem(h)}" for h in heads) or \
            "no head pod yet"
        raise KubernetesError(
            f"RayCluster {name!r} in namespace {ns!r} is not ready: its head pod is not ready.",
            why=f"{ready.explain()}; {detail}.",
            fix=f"Wait and try again (kubectl get raycluster {name} -n {ns} -w); if it stays so, "
                f"kubectl describe pod {pod or '-l ray.io/node-type=head,ray.io/cluster=' + name} "
                f"-n {ns}.", kind="not-ready")
    svc = client.get_service(service, ns)
    port = client_port(svc)
    target = KubeRayTarget(client=client, name=name, namespace=ns, plan=plan, readiness=ready,
                           address="", service=service)
    if address:
        target.address = address
    elif client.in_cluster or os.environ.get("KUBERNETES_SERVICE_HOST"):
        target.address = f"ray://{service}.{ns}.svc.cluster.local:{port}"
    else:
        hint = kubectl_port_forward_hint(service, ns, port, client.context)
        fix: Text = (
            f"Run `{hint}` in a terminal, then ",
            cmd("connect-kuberay", name, namespace=ns, address=f"ray://127.0.0.1:{port}"))
        if not port_forward:
            raise KubernetesError(
                f"RayCluster {name!r} is reachable from this machine only through a port-forward.",
                why="This notebook runs outside the Kubernetes cluster, and the head service "
                    f"{service} resolves only inside it.", fix=fix, kind="port-forward")
        pod, _ = _head_pod(client, obj, name, ns)
        if not pod:
            raise KubernetesError(f"RayCluster {name!r} reports a ready head but no head pod was found.",
                                  why="No pod with labels ray.io/node-type=head, ray.io/cluster="
                                      f"{name} in namespace {ns!r}.", fix=fix, kind="port-forward")
        forward = PortForward(client.api_client.configuration, ns, pod, port)
        local = forward.start(fix=fix)
        target.port_forward = forward
        target.address = f"ray://127.0.0.1:{local}"
    return target
