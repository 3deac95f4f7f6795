"""Run a RayCluster manifest on the local emulator: the same groups, slices, hosts and environment.

The manifest is checked first (CRD schema and the TPU webhook's ``numOfHosts`` rule, see
:func:`raytpu_lab.kuberay.check_manifest`). Each TPU worker group becomes an emulator
:class:`~raytpu_lab.cluster.emulator.HostGroup`: ``replicas`` slices named ``<group>-<replica>``,
``numOfHosts`` Ray nodes each, started as KubeRay starts them (``generateRayStartCommand``):
``--num-cpus`` = the CPU limit rounded up, ``--memory`` = the memory limit in bytes,
``--resources`` = ``{"TPU": google.com/tpu}`` plus the group's ``resources`` map and a
``rayStartParams`` ``resources`` value, ``--labels`` = the group's ``labels`` map, and
``rayStartParams`` ``num-cpus`` / ``memory`` when given. The container's ``env`` is resolved per
host under what GKE and KubeRay inject (:func:`raytpu_lab.cluster.gke_env.tpu_host_environment`).

CPU-only worker groups are not emulated (they carry no TPU); the head is the emulator's own.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from raytpu_lab.cluster import emulator
from raytpu_lab.cluster.emulator import HostGroup
from raytpu_lab.errors import ManifestError
from raytpu_lab.kuberay import RayClusterPlan, check_manifest
from raytpu_lab.kuberay.files import read_manifest
from raytpu_lab.kuberay.groups import TpuWorkerGroup, parse_quantity

__all__ = ["host_groups", "up_from_manifest"]


def _start_param_resources(text: str | None, where: str) -> dict[str, float]:
    """``rayStartParams.resources`` as KubeRay passes it to the shell: a JSON object, possibly
    wrapped in quotes with escaped inner quotes (``'"{\\"TPU\\": 4}"'`` in a KubeRay sample)."""
    if not text:
        return {}
    raw = text.strip()
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
        raw = raw[1:-1].replace('\\"', '"')
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ManifestError(f"{where}.rayStartParams.resources {text!r} is not a JSON object.",
                            why="ray start --resources takes a JSON object of resource amounts.",
                            fix='Write it like \'{"TPU": 4}\'.', problems=[f"{where}.rayStartParams.resources"])
    return {str(k): float(v) for k, v in value.items()}


def _group(group: TpuWorkerGroup, where: str) -> HostGroup:
    params = group.ray_start_params
    cpu = params.get("num-cpus")
    num_cpus = int(float(cpu)) if cpu else (math.ceil(group.cpu) if group.cpu else None)
    memory = params.get("memory")
    memory_bytes = int(parse_quantity(memory)) if memory else group.memory_bytes
    resources = {**_start_param_resources(params.get("resources"), where),
                 **{k: float(parse_quantity(v)) for k, v in group.resources.items()}}
    resources.pop("TPU", None)  # always google.com/tpu, as KubeRay's addWellKnownAcceleratorResources
    return HostGroup(name=group.name, shape=group.shape, replicas=group.replicas, env=group.env,
                     num_cpus=num_cpus, memory_bytes=memory_bytes, resources=resources,
                     labels=dict(group.labels))


def host_groups(plan: RayClusterPlan) -> list[HostGroup]:
    """The emulator groups a plan asks for (suspended or 0-replica groups are left out).

    Raises:
        ManifestError: A ``rayStartParams.resources`` value that is not a JSON object.
    """
    return [_group(g, f"workerGroupSpecs[{i}]") for i, g in enumerate(plan.tpu_groups)
            if g.replicas > 0 and not g.suspend]


def up_from_manifest(manifest: str | Path | Mapping[str, Any], *, name: str | None = None,
                     timeout_s: float = 180.0,
                     progress: Callable[[int, int], None] | None = None) -> emulator.EmulatedCluster:
    """Start the emulated cluster a RayCluster manifest describes.

    Args:
        manifest: A file path (YAML/JSON) or the manifest dict.
        name: Emulated cluster name; the manifest's ``metadata.name`` when ``None`` (cut to
            :func:`~raytpu_lab.cluster.emulator.max_name_length` characters if longer).
        timeout_s: Seconds to wait for every node to start.
        progress: Called as ``progress(hosts up, hosts expected)`` while hosts start.

    Returns:
        The running cluster; its hosts' slice names are ``<groupName>-<replica>``.

    Raises:
        ManifestError: The manifest fails the CRD schema or the TPU rules, or has no TPU slices.
        EmulatorError: As :func:`raytpu_lab.cluster.emulator.up` (too many hosts for this
            machine, a cluster of that name already running, a node failing to start).
    """
    obj, source = read_manifest(manifest)
    plan = check_manifest(obj, source=source)
    groups = host_groups(plan)
    if not groups:
        raise ManifestError(f"{source} asks for no TPU slices.",
                            why="None of its worker groups requests google.com/tpu with replicas > 0.",
                            fix="Add a TPU worker group (raytpu_lab.kuberay.build_raycluster builds one).",
                            source=source)
    if name is None and plan.name:
        # The manifest's name, cut to what Ray's socket paths leave room for (KubeRay sample
        # names such as "raycluster-tpu-v4-multihost" are longer).
        name = plan.name[:emulator.max_name_length()].rstrip("-.") or emulator.DEFAULT_NAME
    return emulator.up(name=name or emulator.DEFAULT_NAME, timeout_s=timeout_s,
                       groups=groups, namespace=plan.namespace or "default", progress=progress)
