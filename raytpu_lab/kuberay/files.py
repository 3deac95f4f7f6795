"""Read and write manifest files (YAML or JSON; one object, or the first RayCluster of several)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from raytpu_lab.errors import ManifestError

__all__ = ["load_manifest", "read_manifest", "dump_manifest", "RAY_KINDS"]

RAY_KINDS = ("RayCluster", "RayJob", "RayService")
"""Kinds whose manifests hold a RayCluster spec."""


def load_manifest(path: str | Path) -> dict[str, Any]:
    """The RayCluster (or RayJob / RayService) object in a YAML or JSON file.

    A file of several documents (``---``) yields the first of those kinds.

    Raises:
        ManifestError: The file cannot be read, is not YAML, or holds no such object.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ManifestError(f"Cannot read the manifest {path}.", why=err.strerror or str(err),
                            fix="Check the file name.", source=str(path)) from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ManifestError(f"{path} is not valid YAML{where}.",
                            why=str(getattr(err, "problem", "") or "the YAML parser refused it"),
                            fix="Fix the YAML (indentation, quotes) and try again.",
                            source=str(path)) from None
    for doc in docs:
        if isinstance(doc, Mapping) and doc.get("kind") in RAY_KINDS:
            return dict(doc)
    kinds = [d.get("kind") if isinstance(d, Mapping) else type(d).__name__ for d in docs]
    raise ManifestError(f"{path} holds no RayCluster.",
                        why=f"Its documents are of kinds {kinds or 'none'}.",
                        fix="Point at a RayCluster (ray.io/v1) manifest, e.g. one written by "
                            "raytpu_lab.kuberay.dump_manifest(build_raycluster(...)).",
                        source=str(path))


def read_manifest(manifest: str | Path | Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """``(manifest dict, source name)`` from a file path or a dict (a dict is copied).

    Raises:
        ManifestError: As :func:`load_manifest`, for a path.
    """
    if isinstance(manifest, Mapping):
        return dict(manifest), "manifest"
    return load_manifest(manifest), str(manifest)


def dump_manifest(manifest: Mapping[str, Any]) -> str:
    """The manifest as YAML, keys in the order given (as ``kubectl apply -f`` reads it)."""
    return yaml.safe_dump(dict(manifest), sort_keys=False, default_flow_style=False)
