"""RayCluster manifests for TPUs on GKE/KubeRay: build, parse, validate (pure; no Kubernetes client).

Words, as KubeRay and GKE use them: a **RayCluster** (``ray.io/v1``) has a head group and
**worker groups**; a TPU worker group's ``replicas`` count **slices**, its ``numOfHosts`` the hosts
(pods, Ray nodes) of one slice, ``google.com/tpu`` the chips per host, and the node selectors
``cloud.google.com/gke-tpu-accelerator`` / ``cloud.google.com/gke-tpu-topology`` the generation and
topology. The head service ``<cluster>-head-svc`` exposes the GCS (6379), the dashboard (8265) and
Ray Client (10001). Facts and sources: ``shared/kuberay/README.md``.

- :func:`build_raycluster` ``("tpu-lab", ["v6e:4x4 x2"])`` -> manifest dict;
- :func:`parse_raycluster` (manifest) -> :class:`RayClusterPlan` (groups, expected slices), raising
  :class:`~raytpu_lab.errors.ManifestError` on the TPU webhook's ``numOfHosts`` rule;
- :func:`validate_manifest` against KubeRay's CRD schema (shipped in this package);
- :func:`check_manifest` both; :func:`load_manifest` / :func:`dump_manifest` for files.

The Kubernetes side (reading a live RayCluster, its pods and head service) is in
:mod:`raytpu_lab.kuberay.client`, loaded only when used.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from raytpu_lab.kuberay.build import (
    GroupSpec,
    build_raycluster,
    default_image,
    group_specs_of,
    parse_group_spec,
)
from raytpu_lab.kuberay.files import dump_manifest, load_manifest
from raytpu_lab.kuberay.groups import (
    CpuWorkerGroup,
    ExpectedSlice,
    HeadGroup,
    RayClusterPlan,
    TpuWorkerGroup,
    head_service_name,
    hosts_for_topology,
    parse_quantity,
    parse_raycluster,
)
from raytpu_lab.kuberay.schema import schema_problems, validate_manifest

__all__ = [
    "GroupSpec",
    "build_raycluster",
    "default_image",
    "group_specs_of",
    "parse_group_spec",
    "dump_manifest",
    "load_manifest",
    "CpuWorkerGroup",
    "ExpectedSlice",
    "HeadGroup",
    "RayClusterPlan",
    "TpuWorkerGroup",
    "head_service_name",
    "hosts_for_topology",
    "parse_quantity",
    "parse_raycluster",
    "schema_problems",
    "validate_manifest",
    "check_manifest",
]


def check_manifest(manifest: Mapping[str, Any], *, source: str = "manifest") -> RayClusterPlan:
    """Validate against the CRD schema, then apply the TPU rules; return what it asks for.

    Raises:
        ManifestError: Schema problems first (the API server would refuse the object), else TPU
            problems (the KubeRay TPU webhook would).
    """
    validate_manifest(manifest, source=source)
    return parse_raycluster(manifest, source=source)
