"""The Kubernetes side: read and change a RayCluster with the official ``kubernetes`` client.

:meth:`KubeRayClient.from_config` loads the user's kubeconfig (``--kubeconfig``, ``$KUBECONFIG`` or
``~/.kube/config``, optionally a ``--context``) or, inside a pod, the in-cluster service account.
Every call goes to the real REST paths of the API server:

- ``GET/PATCH/DELETE /apis/ray.io/v1/namespaces/{ns}/rayclusters/{name}`` (apply is a server-side
  apply ``PATCH``, scale a JSON patch of one group's ``replicas``);
- ``GET /api/v1/namespaces/{ns}/pods?labelSelector=ray.io/cluster={name}``;
- ``GET /api/v1/namespaces/{ns}/services/{name}-head-svc``;
- ``GET /apis/apiextensions.k8s.io/v1/customresourcedefinitions/rayclusters.ray.io``.

Failures become one :class:`~raytpu_lab.errors.KubernetesError` each: no kubeconfig or an
unknown context here, the API's answers (401/403, RayCluster or CRD not found, API server
unreachable) in :mod:`raytpu_lab.kuberay.api_errors`, which also keeps secrets out of messages.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from raytpu_lab.advice import opt
from raytpu_lab.errors import KubernetesError
from raytpu_lab.kuberay.api_errors import GROUP, PLURAL, VERSION, KubernetesApiCalls
from raytpu_lab.kuberay.groups import RayClusterPlan, head_service_name, parse_raycluster

__all__ = ["KubeRayClient", "FIELD_MANAGER"]

CRD_NAME = "rayclusters.ray.io"
FIELD_MANAGER = "raytpu-lab"
"""Server-side apply field manager of :meth:`KubeRayClient.apply`."""
_TIMEOUT_S = 15.0
_IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def _kubeconfig_paths(explicit: str | os.PathLike[str] | None) -> list[Path]:
    if explicit:
        return [Path(explicit).expanduser()]
    env = os.environ.get("KUBECONFIG")
    if env:
        return [Path(p).expanduser() for p in env.split(os.pathsep) if p]
    return [Path("~/.kube/config").expanduser()]


def _secrets_of(paths: Iterable[Path], user: str | None) -> list[str]:
    """Token, password and certificate/key data of the kubeconfig's users (to scrub from text)."""
    found: list[str] = []
    for path in paths:
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue
        for entry in doc.get("users") or []:
            info = (entry or {}).get("user") or {}
            for key in ("token", "password", "client-certificate-data", "client-key-data"):
                value = info.get(key)
                if isinstance(value, str) and len(value) >= 6:
                    found.append(value)
                    if key.endswith("-data"):
                        try:
                            decoded = base64.b64decode(value).decode(errors="ignore")
                        except ValueError:
                            continue
                        found += [line for line in decoded.splitlines() if len(line) >= 16]
    return found


class KubeRayClient(KubernetesApiCalls):
    """RayCluster, pods and head service of one namespace, through the ``kubernetes`` client.

    Create with :meth:`from_config`. Methods return plain JSON dicts shaped as the API returns
    them (``kubectl get -o json``), so the pure modules read them as they read manifests.

    Attributes:
        namespace: The namespace calls use unless told otherwise.
        context: The kubeconfig context used, or ``None`` in-cluster.
        in_cluster: Loaded from the pod's service account.
        host: The API server URL (no credentials).
    """

    def __init__(self, api_client: client.ApiClient, namespace: str, *, context: str | None = None,
                 in_cluster: bool = False, secrets: Iterable[str] = ()) -> None:
        self.api_client = api_client
        self.namespace = namespace
        self.context = context
        self.in_cluster = in_cluster
        self.host = str(api_client.configuration.host)
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.extensions = client.ApiextensionsV1Api(api_client)

    # -- loading ------------------------------------------------------------------------------

    @classmethod
    def from_config(cls, *, context: str | None = None, namespace: str | None = None,
                    kubeconfig: str | os.PathLike[str] | None = None) -> KubeRayClient:
        """Load credentials: a kubeconfig, else the in-cluster service account.

        Args:
            context: A kubeconfig context; the current context when ``None``.
            namespace: Default namespace; the context's namespace (or the pod's), else ``"default"``.
            kubeconfig: A kubeconfig file; ``$KUBECONFIG`` or ``~/.kube/config`` when ``None``.

        Raises:
            KubernetesError: ``kind="no-kubeconfig"`` when there is no kubeconfig and this is no
                pod; ``kind="context"`` when the context does not exist (lists the known ones).
        """
        paths = [p for p in _kubeconfig_paths(kubeconfig) if p.is_file()]
        if not paths and not kubeconfig and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            return cls._in_cluster(namespace)
        if not paths:
            looked = ", ".join(str(p) for p in _kubeconfig_paths(kubeconfig))
            raise KubernetesError(
                "No kubeconfig found, and this is not a Kubernetes pod.",
                why=f"Looked for {looked} ($KUBECONFIG, else ~/.kube/config); "
                    "KUBERNETES_SERVICE_HOST is not set.",
                fix=("Get credentials for the GKE cluster (gcloud container clusters "
                     "get-credentials CLUSTER --location LOCATION), or pass ",
                     opt("kubeconfig", "FILE"), "."),
                kind="no-kubeconfig")
        config_file = os.pathsep.join(str(p) for p in paths) if len(paths) > 1 else str(paths[0])
        try:
            contexts, active = config.list_kube_config_contexts(config_file=config_file)
        except (ConfigException, yaml.YAMLError, OSError, TypeError, AttributeError) as err:
            raise KubernetesError(
                f"The kubeconfig {config_file} could not be read ({type(err).__name__}).",
                why="It is not a kubeconfig with contexts, clusters and users.",
                fix="Check the file (kubectl config view), or get fresh credentials "
                    "(gcloud container clusters get-credentials ...).",
                kind="no-kubeconfig") from None
        names = [str(c.get("name")) for c in contexts or []]
        chosen = next((c for c in contexts or [] if c.get("name") == context), None) if context else active
        if chosen is None:
            raise KubernetesError(
                f"Kubeconfig context {context!r} does not exist." if context else
                "The kubeconfig has no current context.",
                why=f"Contexts in {config_file}: {', '.join(names) or 'none'}.",
                fix=("Pass ", opt("context"), " with one of those (kubectl config get-contexts lists "
                     "them)."),
                kind="context")
        cfg = client.Configuration()
        try:
            config.load_kube_config(config_file=config_file, context=chosen["name"],
                                    client_configuration=cfg, persist_config=False)
        except (ConfigException, ValueError, TypeError, KeyError, OSError) as err:
            raise KubernetesError(
                f"Kubeconfig context {chosen['name']!r} could not be loaded ({type(err).__name__}).",
                why="Its cluster or user entry is incomplete or malformed, or an auth plugin failed.",
                fix="Check it with kubectl config view --minify, or get fresh credentials.",
                kind="context") from None
        cfg.retries = 1
        ns = namespace or (chosen.get("context") or {}).get("namespace") or "default"
        user = (chosen.get("context") or {}).get("user")
        return cls(client.ApiClient(cfg), ns, context=chosen["name"],
                   secrets=[*_secrets_of(paths, user), *_auth_values(cfg)])

    @classmethod
    def _in_cluster(cls, namespace: str | None) -> KubeRayClient:
        cfg = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=cfg)
        except ConfigException:
            raise KubernetesError(
                "This pod's Kubernetes service account could not be loaded.",
                why="KUBERNETES_SERVICE_HOST is set but the token or CA file is missing.",
                fix=("Mount a service account token, or pass ", opt("kubeconfig", "FILE"), "."),
                kind="no-kubeconfig") from None
        cfg.retries = 1
        try:
            ns = namespace or _IN_CLUSTER_NAMESPACE.read_text().strip() or "default"
        except OSError:
            ns = namespace or "default"
        return cls(client.ApiClient(cfg), ns, in_cluster=True, secrets=_auth_values(cfg))

    # -- reading ------------------------------------------------------------------------------

    def get_raycluster(self, name: str, namespace: str | None = None) -> dict[str, Any]:
        """The RayCluster object (``spec`` and ``status``).

        Raises:
            KubernetesError: ``"not-found"`` (names the RayClusters that exist, when listable),
                ``"crd-missing"`` (KubeRay is not installed), ``"forbidden"``, ``"unreachable"``.
        """
        ns = namespace or self.namespace
        return _as_dict(self._call(
            f"read RayCluster {name!r} in namespace {ns!r}",
            lambda: self.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name,
                                                             _request_timeout=_TIMEOUT_S),
            name=name, namespace=ns))

    def list_rayclusters(self, namespace: str | None = None) -> list[str]:
        """Names of the RayClusters in a namespace."""
        ns = namespace or self.namespace
        found = _as_dict(self._call(f"list RayClusters in namespace {ns!r}",
                                    lambda: self.custom.list_namespaced_custom_object(
                                        GROUP, VERSION, ns, PLURAL, _request_timeout=_TIMEOUT_S),
                                    namespace=ns))
        return sorted(str((i.get("metadata") or {}).get("name")) for i in found.get("items") or [])

    def plan(self, name: str, namespace: str | None = None) -> tuple[dict[str, Any], RayClusterPlan]:
        """``(RayCluster object, its plan)``: the slices its worker groups ask for."""
        obj = self.get_raycluster(name, namespace)
        return obj, parse_raycluster(obj, source=f"RayCluster {name}")

    def list_pods(self, cluster: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Pods of a RayCluster (label ``ray.io/cluster=<cluster>``), head and workers."""
        ns = namespace or self.namespace
        pods = self._call(
            f"list the pods of RayCluster {cluster!r} in namespace {ns!r}",
            lambda: _raw(self.core.list_namespaced_pod(
                ns, label_selector=f"ray.io/cluster={cluster}", _request_timeout=_TIMEOUT_S,
                _preload_content=False)),
            namespace=ns)
        return list(pods.get("items") or [])

    def get_service(self, name: str, namespace: str | None = None) -> dict[str, Any]:
        """A Service object, e.g. the head service ``<cluster>-head-svc``."""
        ns = namespace or self.namespace
        return self._call(f"read Service {name!r} in namespace {ns!r}",
                          lambda: _raw(self.core.read_namespaced_service(
                              name, ns, _request_timeout=_TIMEOUT_S, _preload_content=False)),
                          name=name, namespace=ns, resource="Service")

    def head_service(self, plan: RayClusterPlan, namespace: str | None = None) -> dict[str, Any]:
        """The head service of a RayCluster (``headService`` name, else ``<cluster>-head-svc``)."""
        return self.get_service(plan.service_name or head_service_name(plan.name), namespace)

    def crd_installed(self) -> bool | None:
        """Whether ``rayclusters.ray.io`` exists; ``None`` when this user may not read CRDs."""
        try:
            _raw(self.extensions.read_custom_resource_definition(
                CRD_NAME, _request_timeout=_TIMEOUT_S, _preload_content=False))
            return True
        except ApiException as err:
            if err.status == 404:
                return False
            if err.status in (401, 403):
                return None
            raise self._translate(err, "read the RayCluster CRD") from None
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise self._unreachable(err, "read the RayCluster CRD") from None

    # -- changing -----------------------------------------------------------------------------

    def apply(self, manifest: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        """Create or update a RayCluster by server-side apply (``kubectl apply --server-side``).

        Args:
            manifest: A RayCluster object (check it first with :func:`raytpu_lab.kuberay.check_manifest`).
            namespace: Overrides ``metadata.namespace`` and the client's namespace.

        Returns:
            The object as stored.
        """
        meta = manifest.get("metadata") or {}
        ns = namespace or meta.get("namespace") or self.namespace
        name = str(meta.get("name"))
        body = {**manifest, "metadata": {**meta, "namespace": ns}}
        # Raw: the generated method maps only a 200 answer to a body, and creation answers 201.
        return self._call(
            f"apply RayCluster {name!r} in namespace {ns!r}",
            lambda: _raw(self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL, name, body, field_manager=FIELD_MANAGER, force=True,
                _content_type="application/apply-patch+yaml", _request_timeout=_TIMEOUT_S,
                _preload_content=False)),
            name=name, namespace=ns, creating=True)

    def scale(self, name: str, group: str, slices: int, namespace: str | None = None
              ) -> tuple[dict[str, Any], list[str]]:
        """Set one worker group's ``replicas`` (slices), widening ``minReplicas``/``maxReplicas``
        when needed so KubeRay does not clamp it.

        A JSON patch (``test`` of the group's name at its index, then ``replace``), so a
        concurrent edit that reorders groups fails instead of scaling the wrong group.

        Returns:
            ``(the updated object, notes such as "maxReplicas raised from 1 to 2")``.

        Raises:
            KubernetesError: ``"not-found"`` also when the RayCluster has no such group (lists them).
        """
        ns = namespace or self.namespace
        obj = self.get_raycluster(name, ns)
        specs = (obj.get("spec") or {}).get("workerGroupSpecs") or []
        names = [str(g.get("groupName")) for g in specs]
        if group not in names:
            raise KubernetesError(
                f"RayCluster {name!r} has no worker group {group!r}.",
                why=f"Its worker groups: {', '.join(names) or 'none'}.",
                fix="Pass one of those as GROUP.", kind="not-found", status=404)
        i = names.index(group)
        spec = specs[i]
        ops: list[dict[str, Any]] = [
            {"op": "test", "path": f"/spec/workerGroupSpecs/{i}/groupName", "value": group},
            {"op": "replace" if "replicas" in spec else "add",
             "path": f"/spec/workerGroupSpecs/{i}/replicas", "value": slices}]
        notes = []
        lo, hi = spec.get("minReplicas", 0), spec.get("maxReplicas", 2**31 - 1)
        if slices > hi:
            ops.append({"op": "replace" if "maxReplicas" in spec else "add",
                        "path": f"/spec/workerGroupSpecs/{i}/maxReplicas", "value": slices})
            notes.append(f"maxReplicas raised from {hi} to {slices}")
        if slices < lo:
            ops.append({"op": "replace", "path": f"/spec/workerGroupSpecs/{i}/minReplicas",
                        "value": slices})
            notes.append(f"minReplicas lowered from {lo} to {slices}")
        updated = self._call(
            f"scale worker group {group!r} of RayCluster {name!r}",
            lambda: self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL, name, ops, _content_type="application/json-patch+json",
                _request_timeout=_TIMEOUT_S),
            name=name, namespace=ns)
        return _as_dict(updated), notes

    def delete(self, name: str, namespace: str | None = None) -> None:
        """Delete a RayCluster (KubeRay deletes its pods and services)."""
        ns = namespace or self.namespace
        self._call(f"delete RayCluster {name!r} in namespace {ns!r}",
                   lambda: self.custom.delete_namespaced_custom_object(
                       GROUP, VERSION, ns, PLURAL, name, _request_timeout=_TIMEOUT_S),
                   name=name, namespace=ns)

    def _existing_names(self, namespace: str) -> list[str] | None:
        try:
            return self.list_rayclusters(namespace)
        except KubernetesError:
            return None


def _raw(response: Any) -> dict[str, Any]:
    """The JSON body of a ``_preload_content=False`` response, as the API server sent it.

    Read raw, not through the client's models: they drop nothing we need, but they refuse
    partial objects, and the pure modules read the same ``kubectl get -o json`` shape as manifests.
    """
    try:
        value = json.loads(response.data)
    finally:
        response.release_conn()
    return value if isinstance(value, dict) else {}


def _as_dict(value: object) -> dict[str, Any]:
    """The custom-objects API returns parsed JSON typed as ``object``."""
    return dict(value) if isinstance(value, Mapping) else {}


def _auth_values(cfg: client.Configuration) -> list[str]:
    values = []
    for value in (cfg.api_key or {}).values():
        if value:
            values.append(str(value))
    for prefixed in (cfg.api_key_prefix or {}).values():
        del prefixed  # the prefix ("Bearer") is no secret
    if getattr(cfg, "password", None):
        values.append(str(cfg.password))
    return values


