"""Build a RayCluster (``ray.io/v1``) manifest with TPU worker groups from short specs.

Pure: returns a plain dict (dump it with ``yaml.safe_dump`` or send it to the API). The shape
follows KubeRay's TPU samples (``ray-cluster.tpu-v6e-16-multihost.yaml`` and friends):

- one worker group per spec, ``groupName`` ``tpu-<version>-<topology>`` (the emulator's name),
  ``replicas`` = slices, ``numOfHosts`` by the TPU webhook's rule;
- ``google.com/tpu`` requests = limits = chips per host; CPU and memory requests = limits;
- node selectors ``cloud.google.com/gke-tpu-accelerator`` and ``cloud.google.com/gke-tpu-topology``;
- ``rayStartParams: {}`` (KubeRay derives ``ray start`` from the container resources);
- head ports ``gcs-server`` 6379, ``dashboard`` 8265, ``client`` 10001, ``serve`` 8000; multi-host
  workers also expose 8081 (``mxla``, megascale), as the multi-host samples do.

Example::

    >>> m = build_raycluster("tpu-lab", ["v6e:4x4 x2"], image="rayproject/ray:2.60.0-py311")
    >>> g = m["spec"]["workerGroupSpecs"][0]
    >>> g["groupName"], g["replicas"], g["numOfHosts"]
    ('tpu-v6e-4x4', 2, 4)
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from raytpu_lab.errors import InvalidTopologyError
from raytpu_lab.kuberay.groups import (
    ACCELERATOR_SELECTOR,
    TOPOLOGY_SELECTOR,
    TPU_RESOURCE,
    TpuWorkerGroup,
    hosts_for_topology,
)
from raytpu_lab.tpu.topology import SliceShape, parse_spec

__all__ = ["GroupSpec", "parse_group_spec", "build_raycluster", "default_image", "group_specs_of"]

_GROUP_RE = re.compile(r"^\s*(\S+?:\S+?)(?:\s+[x\u00d7*]\s*(\d+))?\s*$")
_HEAD_PORTS = (("gcs-server", 6379), ("dashboard", 8265), ("client", 10001), ("serve", 8000))


def default_image() -> str:
    """``rayproject/ray:<this Ray>-py<this Python>``: Ray Client needs the notebook's Ray and
    Python versions on the cluster. TPU work also needs ``jax[tpu]`` in the image (or a runtime env)."""
    try:
        ray_version = metadata.version("ray")
    except metadata.PackageNotFoundError:  # pragma: no cover - Ray is a dependency
        ray_version = "latest"
    return f"rayproject/ray:{ray_version}-py{sys.version_info.major}{sys.version_info.minor}"


@dataclass(frozen=True)
class GroupSpec:
    """One TPU worker group to build.

    Attributes:
        shape: Generation, topology and chips per host.
        slices: ``replicas`` (slices wanted now).
        name: ``groupName``; ``tpu-<version>-<topology>`` when empty.
        min_slices: ``minReplicas``; ``slices`` when ``None``.
        max_slices: ``maxReplicas``; ``slices`` when ``None``.
        accelerator: The ``gke-tpu-accelerator`` selector; the generation's GKE name when empty
            (``tpu-v5-lite-device`` is the other v5e choice).
    """

    shape: SliceShape
    slices: int = 1
    name: str = ""
    min_slices: int | None = None
    max_slices: int | None = None
    accelerator: str = ""

    @property
    def group_name(self) -> str:
        """The ``groupName`` this spec builds."""
        return self.name or f"tpu-{self.shape.version}-{self.shape.topology}"


def parse_group_spec(text: str) -> GroupSpec:
    """Read ``"<version>:<topology> [x<slices>]"``, e.g. ``"v6e:4x4 x2"``, ``"v4:2x2x2"``.

    Raises:
        InvalidTopologyError: Not of that form, or not a valid shape.
    """
    match = _GROUP_RE.match(text) if isinstance(text, str) else None
    if not match:
        raise InvalidTopologyError(
            f"Cannot read TPU worker group {text!r}.",
            "A group is '<accelerator version>:<topology>', optionally followed by ' x<slices>'.",
            "Write it like 'v6e:4x4 x2' (2 slices of v6e 4x4) or 'v4:2x2x2'.")
    slices = int(match.group(2) or 1)
    if slices < 1:
        raise InvalidTopologyError(f"{text!r} asks for {slices} slices.",
                                   "A worker group built here has at least 1 slice.",
                                   "Write e.g. 'v6e:4x4 x1'.")
    return GroupSpec(parse_spec(match.group(1)), slices)


def group_specs_of(groups: Sequence[TpuWorkerGroup]) -> list[GroupSpec]:
    """:class:`GroupSpec` s that rebuild parsed TPU groups (same names, shapes and replica counts)."""
    return [GroupSpec(g.shape, g.replicas, g.name, g.min_replicas, g.max_replicas, g.accelerator)
            for g in groups]


def _as_spec(group: str | GroupSpec | tuple[str, int]) -> GroupSpec:
    if isinstance(group, GroupSpec):
        return group
    if isinstance(group, tuple):
        spec, slices = group
        return GroupSpec(parse_spec(spec), int(slices))
    return parse_group_spec(group)


def _resources(cpu: str | int, memory: str, tpu: int | None = None) -> dict[str, Any]:
    amounts: dict[str, Any] = {"cpu": str(cpu), "memory": str(memory)}
    if tpu is not None:
        amounts[TPU_RESOURCE] = str(tpu)
    return {"limits": dict(amounts), "requests": dict(amounts)}


def _env(env: Mapping[str, str] | None) -> list[dict[str, str]]:
    return [{"name": k, "value": str(v)} for k, v in (env or {}).items()]


def build_raycluster(
    name: str,
    groups: Sequence[str | GroupSpec | tuple[str, int]],
    *,
    image: str | None = None,
    cpu: str | int = "8",
    memory: str = "32G",
    head_cpu: str | int = "2",
    head_memory: str = "8G",
    namespace: str | None = None,
    env: Mapping[str, str] | None = None,
    ray_version: str | None = None,
) -> dict[str, Any]:
    """A RayCluster manifest with one TPU worker group per entry of ``groups``.

    Args:
        name: ``metadata.name`` (the RayCluster; its head service is ``<name>-head-svc``).
        groups: ``"v6e:4x4 x2"`` strings, ``("v6e:4x4", 2)`` pairs or :class:`GroupSpec` s.
        image: Container image of head and workers; :func:`default_image` when ``None``.
        cpu: CPU request = limit of each TPU host pod (a Kubernetes quantity, e.g. ``"24"``).
        memory: Memory request = limit of each TPU host pod, e.g. ``"200G"``.
        head_cpu: The head pod's CPU.
        head_memory: The head pod's memory.
        namespace: ``metadata.namespace``; left out when ``None`` (the client's namespace).
        env: Extra environment of the TPU worker containers, e.g. ``{"JAX_PLATFORMS": "tpu,cpu"}``.
        ray_version: ``spec.rayVersion``; the image's Ray version when ``None``.

    Returns:
        The manifest as a dict; :func:`raytpu_lab.kuberay.validate_manifest` accepts it.

    Raises:
        InvalidTopologyError: A group spec that is no valid shape, or two groups with one name.
    """
    specs = [_as_spec(g) for g in groups]
    names = [s.group_name for s in specs]
    if len(set(names)) != len(names):
        raise InvalidTopologyError(
            f"Two worker groups would be called {sorted({n for n in names if names.count(n) > 1})}.",
            "KubeRay needs one groupName per worker group; the default name is tpu-<version>-<topology>.",
            "Give one group more slices ('v6e:4x4 x2') instead of repeating it, or name the groups.")
    image = image or default_image()
    version = ray_version or image.rsplit(":", 1)[-1].split("-", 1)[0]
    metadata_: dict[str, Any] = {"name": name}
    if namespace:
        metadata_["namespace"] = namespace
    head = {
        "rayStartParams": {},
        "template": {"spec": {"containers": [{
            "name": "ray-head", "image": image,
            "resources": _resources(head_cpu, head_memory),
            "ports": [{"containerPort": port, "name": pname} for pname, port in _HEAD_PORTS],
        }]}},
    }
    workers = [_worker_group(spec, image, cpu, memory, env) for spec in specs]
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": metadata_,
            "spec": {"rayVersion": version, "headGroupSpec": head, "workerGroupSpecs": workers}}


def _worker_group(spec: GroupSpec, image: str, cpu: str | int, memory: str,
                  env: Mapping[str, str] | None) -> dict[str, Any]:
    shape = spec.shape
    accelerator = spec.accelerator or shape.generation.gke_accelerator
    if accelerator is None:
        raise InvalidTopologyError(
            f"GKE has no TPU node pools of {shape.version}.",
            "GKE offers v4, v5e (v5litepod), v5p, v6e and 7x (tpu7x) TPUs.",
            "Pick one of those generations.")
    hosts = hosts_for_topology(shape.topology, shape.chips_per_host)
    container: dict[str, Any] = {
        "name": "ray-worker", "image": image,
        "resources": _resources(cpu, memory, shape.chips_per_host),
    }
    if env:
        container["env"] = _env(env)
    if hosts > 1:
        container["ports"] = [{"containerPort": 8081, "name": "mxla"}]
    return {
        "groupName": spec.group_name,
        "replicas": spec.slices,
        "minReplicas": spec.slices if spec.min_slices is None else spec.min_slices,
        "maxReplicas": spec.slices if spec.max_slices is None else spec.max_slices,
        "numOfHosts": hosts,
        "rayStartParams": {},
        "template": {"spec": {
            "containers": [container],
            "nodeSelector": {ACCELERATOR_SELECTOR: accelerator, TOPOLOGY_SELECTOR: shape.topology},
        }},
    }
