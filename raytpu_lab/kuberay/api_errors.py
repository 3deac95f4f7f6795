"""Calls to the Kubernetes API, and their failures as one :class:`~raytpu_lab.errors.KubernetesError` each.

Failures are told apart (401/403, RayCluster or CRD not found, API server unreachable, any other
answer). Secrets never leave this module: messages are built from the HTTP status, the API
server's ``Status`` message (scrubbed of the loaded token and certificate data) and our own
words; the client's exception text (which holds response headers) is never shown.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import urllib3
from kubernetes.client.exceptions import ApiException

from raytpu_lab.advice import cmd, opt
from raytpu_lab.errors import KubernetesError

__all__ = ["KubernetesApiCalls", "RBAC_HINT", "GROUP", "VERSION", "PLURAL"]

GROUP, VERSION, PLURAL = "ray.io", "v1", "rayclusters"
RBAC_HINT = ("get/list/patch/create/delete on rayclusters.ray.io, get/list on pods and services, "
             "and create on pods/portforward for a port-forward")
_T = TypeVar("_T")


class KubernetesApiCalls:
    """Runs one Kubernetes API call and translates its failure (base of
    :class:`~raytpu_lab.kuberay.client.KubeRayClient`).

    Attributes:
        namespace: The namespace calls use unless told otherwise.
        host: The API server URL (no credentials).
    """

    namespace: str
    host: str
    _secrets: list[str]

    def scrub(self, text: str) -> str:
        """``text`` with every loaded secret (token, certificate and key data) masked."""
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _call(self, what: str, fn: Callable[[], _T], *, name: str = "", namespace: str = "",
              resource: str = "RayCluster", creating: bool = False) -> _T:
        try:
            return fn()
        except ApiException as err:
            raise self._translate(err, what, name=name, namespace=namespace, resource=resource,
                                  creating=creating) from None
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise self._unreachable(err, what) from None

    def _unreachable(self, err: BaseException, what: str) -> KubernetesError:
        return KubernetesError(
            f"Could not {what}: the Kubernetes API server at {self.host} did not answer.",
            why=f"{type(err).__name__} (network, VPN or an expired cluster endpoint).",
            fix=("Check that kubectl get nodes works from this machine, or pick another ",
                 opt("context"), "."),
            kind="unreachable")

    def _translate(self, err: ApiException, what: str, *, name: str = "", namespace: str = "",
                   resource: str = "RayCluster", creating: bool = False) -> KubernetesError:
        status = int(err.status or 0)
        body = _status_body(err)
        message = self.scrub(str(body.get("message") or ""))[:400] if body else ""
        ns = namespace or self.namespace
        if status == 401:
            return KubernetesError(
                f"Could not {what}: the API server refused the credentials (401 Unauthorized).",
                why="The token or client certificate in the kubeconfig is expired or wrong.",
                fix="Get fresh credentials: gcloud container clusters get-credentials CLUSTER "
                    "--location LOCATION.", kind="forbidden", status=status)
        if status == 403:
            return KubernetesError(
                f"Could not {what}: Kubernetes RBAC forbids it (403 Forbidden).",
                why=message or "The user or service account lacks the permission.",
                fix=f"Ask a cluster admin for a Role in namespace {ns!r} with {RBAC_HINT}; check "
                    f"with kubectl auth can-i get rayclusters.ray.io -n {ns}.",
                kind="forbidden", status=status)
        if status == 404 and resource == "RayCluster" and not creating and not _is_not_found_of(body, PLURAL):
            return self._crd_missing(what)
        if status == 404 and creating:
            return self._crd_missing(what)
        if status == 404:
            existing = self._existing_names(ns) if resource == "RayCluster" else None
            listed = (f"RayClusters in {ns!r}: {', '.join(existing) or 'none'}." if existing is not None
                      else f"No {resource} {name!r} in namespace {ns!r}.")
            return KubernetesError(
                f"Could not {what}: {resource} {name!r} not found in namespace {ns!r}.",
                why=listed,
                fix=("Check the name and namespace (", opt("namespace", "NAMESPACE"),
                     "; kubectl get rayclusters -A), or create it (", cmd("apply", "FILE"), ")."),
                kind="not-found", status=status)
        return KubernetesError(
            f"Could not {what}: the API server answered {status} {err.reason or ''}".rstrip() + ".",
            why=message or "No further detail in the response.",
            fix="Fix the cause above; kubectl shows the same error for the same request.",
            kind="api", status=status)

    def _crd_missing(self, what: str) -> KubernetesError:
        return KubernetesError(
            f"Could not {what}: the RayCluster resource (rayclusters.ray.io) is not installed.",
            why=("The API server does not serve ray.io/v1 rayclusters: the KubeRay operator and "
                 "its CRDs are not installed on this cluster (or this is the wrong ",
                 opt("context"), ")."),
            fix=("Install KubeRay (on GKE: enable the Ray operator add-on, or helm install "
                 "kuberay-operator), or pick the right ", opt("context"), "."),
            kind="crd-missing", status=404)

    def _existing_names(self, namespace: str) -> list[str] | None:
        """The RayClusters in ``namespace`` a not-found message names; ``None`` when unknown."""
        return None


def _status_body(err: ApiException) -> dict[str, Any]:
    """The ``Status`` object of an error response, or ``{}`` (e.g. "404 page not found")."""
    try:
        body = json.loads(err.body or b"")
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) and body.get("kind") == "Status" else {}



def _is_not_found_of(body: Mapping[str, Any], plural: str) -> bool:
    """A 404 ``Status`` about an object of the resource (vs. the resource itself being unknown)."""
    details = body.get("details") or {}
    return body.get("reason") == "NotFound" and str(details.get("kind", plural)) == plural
