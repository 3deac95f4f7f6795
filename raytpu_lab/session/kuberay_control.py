"""KubeRay control from a session: connect to a RayCluster, apply, scale and delete them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raytpu_lab.advice import cmd, opt
from raytpu_lab.errors import ManifestError, RaytpuError

if TYPE_CHECKING:
    from raytpu_lab.kuberay.client import KubeRayClient
    from raytpu_lab.kuberay.connect import KubeRayTarget
    from raytpu_lab.state.planned import PlannedSlice

__all__ = ["KubeRayControl"]


class KubeRayControl:
    """The RayCluster this session is connected to, and the Kubernetes calls on RayClusters.

    Args:
        connect: Connects the Ray driver to an address with a timeout in seconds (the
            session's connection; it drops the current target first).

    Attributes:
        target: The connected RayCluster, or ``None``.
    """

    def __init__(self, connect: Callable[..., str]) -> None:
        self._connect = connect
        self.target: KubeRayTarget | None = None

    def connect(self, name: str, *, namespace: str | None = None, context: str | None = None,
                kubeconfig: str | None = None, address: str | None = None,
                port_forward: bool = True, timeout_s: float = 15.0) -> KubeRayTarget:
        """Connect to RayCluster ``name`` on Kubernetes (KubeRay on GKE) with the ``kubernetes`` client.

        Reads the RayCluster (its worker groups give the expected slices), requires
        ``HeadPodReady``, finds ``<name>-head-svc`` and connects a Ray Client: in-cluster through
        the service's DNS name, from outside through a port-forward set up here, or at ``address``
        if given. Afterwards the session's snapshot also shows expected hosts that have not joined Ray
        (``"provisioning"``, with their pod's reason) and slices KubeRay is replacing.

        Args:
            name: The RayCluster.
            namespace: Its namespace; the kubeconfig context's namespace when ``None``.
            context: A kubeconfig context; the current one when ``None``.
            kubeconfig: A kubeconfig file; ``$KUBECONFIG`` / ``~/.kube/config`` when ``None``.
            address: A Ray address to use instead (e.g. ``ray://127.0.0.1:10001``).
            port_forward: Set up a port-forward when outside the cluster (else raise with the
                ``kubectl port-forward`` command to run).
            timeout_s: Seconds to wait for the Ray address to answer.

        Returns:
            The :class:`~raytpu_lab.kuberay.connect.KubeRayTarget` (also :attr:`target`).

        Raises:
            KubernetesError: No kubeconfig, unknown context, RBAC 403, RayCluster or CRD not
                found, head not ready, port-forward refused (one clear message each).
            ManifestError: The RayCluster's TPU groups break the webhook's rules.
            ConnectError: The Ray address does not answer, or Ray refuses to connect.
        """
        from raytpu_lab.kuberay.connect import resolve

        target = resolve(name, namespace=namespace, context=context, kubeconfig=kubeconfig,
                         address=address, port_forward=port_forward)
        try:
            self._connect(target.address, timeout_s=timeout_s)
        except BaseException:
            target.close()
            raise
        self.target = target
        return target

    def expectation(self) -> tuple[dict[str, int] | None, list[PlannedSlice] | None]:
        """``(hosts expected per slice, planned slices)`` of the connected RayCluster, or
        ``(None, None)`` without one.

        Raises:
            KubernetesError: The API server has not answered for 60 s.
        """
        if self.target is None:
            return None, None
        planned = self.target.planned()
        return self.target.plan.expected_hosts, planned

    def apply(self, manifest: str | Path | Mapping[str, Any], *, namespace: str | None = None,
              context: str | None = None, kubeconfig: str | None = None) -> dict[str, Any]:
        """Validate a RayCluster manifest and create or update it on Kubernetes (server-side apply).

        Returns:
            The RayCluster as stored by the API server.

        Raises:
            ManifestError: It fails the CRD schema or the TPU rules (nothing is sent).
            KubernetesError: As :meth:`connect`.
        """
        from raytpu_lab.kuberay import check_manifest
        from raytpu_lab.kuberay.files import read_manifest

        obj, source = read_manifest(manifest)
        if obj.get("kind") != "RayCluster":
            raise ManifestError(f"{source} is a {obj.get('kind')}, not a RayCluster.",
                                why="apply creates RayClusters only.",
                                fix="Apply RayJobs and RayServices with kubectl apply -f.", source=source)
        check_manifest(obj, source=source)
        result: dict[str, Any] = self._client(namespace, context, kubeconfig).apply(obj, namespace)
        return result

    def scale(self, group: str, slices: int, *, name: str | None = None,
              namespace: str | None = None, context: str | None = None,
              kubeconfig: str | None = None) -> list[str]:
        """Set a TPU worker group's slice count (``replicas``) on Kubernetes.

        Args:
            group: The worker group's ``groupName``.
            slices: Slices wanted (KubeRay creates or deletes whole slices).
            name: The RayCluster; the connected one (:meth:`connect`) when ``None``.

        Returns:
            Notes on bounds widened (``maxReplicas`` / ``minReplicas``).

        Raises:
            RaytpuError: ``slices`` below 0, or no RayCluster named and none connected.
            KubernetesError: As :meth:`connect`, or no such group.
        """
        if slices < 0:
            raise RaytpuError((opt("slices", slices), " is not allowed."),
                              why="A group has 0 or more slices.",
                              fix=("Pass ", opt("slices", 0), " or more."))
        client, name, namespace = self._which(name, namespace, context, kubeconfig, "scale")
        _, notes = client.scale(name, group, slices, namespace)
        if self.target is not None:
            self.target.forget_plan()  # read the new plan on the next snapshot
        return list(notes)

    def delete(self, name: str | None = None, *, yes: bool = False,
               namespace: str | None = None, context: str | None = None,
               kubeconfig: str | None = None) -> tuple[str, bool]:
        """Delete a RayCluster; as :meth:`raytpu_lab.lab.Session.delete_raycluster`.

        Returns:
            ``(its name, whether it was the connected one)``; the target is dropped then.
        """
        client, name, namespace = self._which(name, namespace, context, kubeconfig, "delete")
        if not yes:
            raise RaytpuError(f"Not deleting RayCluster {name!r}: not confirmed.",
                              why="Deleting it stops every pod and frees its TPU slices.",
                              fix=("Confirm with ", opt("yes", True), "."))
        client.delete(name, namespace)
        was_target = self.target is not None and self.target.name == name
        if was_target:
            self.drop()
        return name, was_target

    def drop(self) -> None:
        """Forget the connected RayCluster (stops its port-forward)."""
        if self.target is not None:
            self.target.close()
            self.target = None

    def _client(self, namespace: str | None, context: str | None,
                kubeconfig: str | None) -> KubeRayClient:
        from raytpu_lab.kuberay.client import KubeRayClient

        if self.target is not None and context is None and kubeconfig is None:
            return self.target.client
        return KubeRayClient.from_config(context=context, namespace=namespace, kubeconfig=kubeconfig)

    def _which(self, name: str | None, namespace: str | None, context: str | None,
               kubeconfig: str | None, doing: str) -> tuple[KubeRayClient, str, str | None]:
        if name is None:
            if self.target is None:
                raise RaytpuError(f"Cannot {doing}: which RayCluster?",
                                  why="No RayCluster was named and this session is connected to none.",
                                  fix=("Name it (", opt("cluster", "NAME"), ") or connect first (",
                                       cmd("connect-kuberay", "NAME"), ")."))
            name = self.target.name
            namespace = namespace or self.target.namespace
        return self._client(namespace, context, kubeconfig), name, namespace
