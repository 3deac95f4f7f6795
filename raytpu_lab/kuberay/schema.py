"""Validate a RayCluster manifest against KubeRay's CRD schema with ``jsonschema``, as the API server would.

The schema ships inside the package (``raycluster_v1_schema.json``): the ``v1`` (storage version)
``openAPIV3Schema`` of ``rayclusters.ray.io``, copied unchanged from KubeRay's
``ray-operator/config/crd/bases/ray.io_rayclusters.yaml`` at commit
``feeaf72facab4881ba2b179248bb67315634e229`` (``shared/kuberay/raycluster-crd.yaml``;
``tests/unit`` checks the copy against that file when it is present).

Before checking, we do what the Kubernetes API server does with a structural schema:

- **defaulting**: missing properties that have a ``default`` get it (so ``minReplicas`` and
  ``maxReplicas``, "required" but defaulted, may be left out, as KubeRay's samples do);
- **strict field validation** (``kubectl apply`` since Kubernetes 1.27: ``--validate=strict``):
  a field the schema does not know (``numOfHost``) is an error rather than silently pruned;
- OpenAPI's ``nullable: true`` admits ``null``.

Not checked here: CEL rules (``x-kubernetes-validations``; the CRD has two, both about updates or
``managedBy``), ``format`` (int32 ranges, date-time), and ``metadata`` (the API server validates
object metadata itself). TPU rules (``numOfHosts``) are :func:`raytpu_lab.kuberay.groups.parse_raycluster`'s job.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

import jsonschema

from raytpu_lab.errors import ManifestError
from raytpu_lab.kuberay.groups import raycluster_spec

__all__ = ["raycluster_schema", "schema_problems", "validate_manifest", "SCHEMA_SOURCE"]

_SCHEMA_FILE = "raycluster_v1_schema.json"
_MAX_LISTED = 10
SCHEMA_SOURCE = ("ray-project/kuberay ray-operator/config/crd/bases/ray.io_rayclusters.yaml "
                 "@ feeaf72facab4881ba2b179248bb67315634e229, version v1")
"""Where the shipped schema comes from."""


@functools.lru_cache(maxsize=1)
def _shipped() -> dict[str, Any]:
    text = resources.files("raytpu_lab.kuberay").joinpath(_SCHEMA_FILE).read_text()
    return json.loads(text)  # type: ignore[no-any-return]


def raycluster_schema() -> dict[str, Any]:
    """The CRD's ``v1`` ``openAPIV3Schema`` as shipped (a fresh deep copy; about 150 kB)."""
    return copy.deepcopy(_shipped()["openAPIV3Schema"])


def _strict(schema: Any) -> Any:
    """The schema with Kubernetes' strict-field and nullable semantics made explicit."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if (out.get("type") == "object" and "properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    if out.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


@functools.lru_cache(maxsize=1)
def _validator() -> jsonschema.protocols.Validator:
    schema = _strict(_shipped()["openAPIV3Schema"])
    # OpenAPI v3.0 schemas are JSON Schema draft 4 plus a few keywords (nullable, x-kubernetes-*).
    return jsonschema.Draft4Validator(schema)  # type: ignore[no-any-return]


def _apply_defaults(schema: Mapping[str, Any], value: Any) -> Any:
    """Fill missing properties that have a ``default``, recursively (API-server defaulting)."""
    if isinstance(value, dict) and schema.get("type") == "object":
        props = schema.get("properties") or {}
        for key, sub in props.items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
        for key, item in value.items():
            if key in props:
                _apply_defaults(props[key], item)
            elif isinstance(schema.get("additionalProperties"), Mapping):
                _apply_defaults(schema["additionalProperties"], item)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for item in value:
            _apply_defaults(schema["items"], item)
    return value


def _path(parts: Any) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def _object_for_schema(manifest: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """A RayCluster-shaped copy to validate, and where its ``spec`` sits in the original."""
    if manifest.get("kind") == "RayCluster":
        return copy.deepcopy(dict(manifest)), "spec"
    spec, path = raycluster_spec(manifest)  # RayJob: spec.rayClusterSpec
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {},
            "spec": copy.deepcopy(dict(spec))}, path


def schema_problems(manifest: Mapping[str, Any]) -> list[str]:
    """Every way ``manifest`` breaks the RayCluster CRD schema, one line each, sorted by path.

    A RayJob or RayService is checked through the RayCluster spec it embeds. ``apiVersion`` must
    be ``ray.io/v1``.

    Returns:
        e.g. ``["spec.workerGroupSpecs[0].replicas: 'two' is not of type 'integer'"]``; empty
        when valid.
    """
    raycluster_spec(manifest)  # kind and embedded spec checks, as a ManifestError
    problems = []
    if manifest.get("apiVersion") != "ray.io/v1":
        problems.append(f"apiVersion: {manifest.get('apiVersion')!r}, expected 'ray.io/v1'")
    obj, spec_path = _object_for_schema(manifest)
    _apply_defaults(_shipped()["openAPIV3Schema"], obj)
    for err in sorted(_validator().iter_errors(obj), key=lambda e: [str(p) for p in e.path]):
        path = _path(err.path)
        if path.startswith("spec"):
            path = spec_path + path[len("spec"):]
        problems.append(f"{path}: {_short(err)}")
    return problems


def _short(err: jsonschema.ValidationError) -> str:
    text = err.message
    return text if len(text) <= 200 else text[:197] + "..."


def validate_manifest(manifest: Mapping[str, Any], *, source: str = "manifest") -> None:
    """Raise unless ``manifest`` passes the RayCluster CRD schema (see the module docstring).

    Args:
        manifest: A RayCluster (or RayJob / RayService) object.
        source: A name for messages, e.g. the file name.

    Raises:
        ManifestError: It does not; ``.problems`` lists every problem.
    """
    problems = schema_problems(manifest)
    if problems:
        shown = "; ".join(problems[:3]) + (f" (+{len(problems) - 3} more)" if len(problems) > 3 else "")
        raise ManifestError(
            f"{source} does not match the RayCluster CRD schema (ray.io/v1): {shown}",
            why="The Kubernetes API server would refuse it (KubeRay's CRD openAPIV3Schema, with "
                "strict field validation as kubectl applies it).",
            fix="Fix the fields listed in .problems (a typo in a field name shows as 'Additional "
                "properties are not allowed').",
            source=source, problems=problems[:_MAX_LISTED * 5])
