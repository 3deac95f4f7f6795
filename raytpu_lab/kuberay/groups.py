"""Read a RayCluster manifest's TPU worker groups: which slices it asks for, and the TPU rules.

Pure: plain dicts in, frozen dataclasses out; no Kubernetes client, no Ray.

One ``spec.workerGroupSpecs[]`` entry is one kind of slice (``shared/kuberay/README.md`` (b)):

- ``replicas`` / ``minReplicas`` / ``maxReplicas`` count **slices**;
- ``numOfHosts`` (default 1) is hosts (pods = Ray nodes) per slice;
- ``containers[0].resources.{requests,limits}["google.com/tpu"]`` is chips per host;
- ``nodeSelector["cloud.google.com/gke-tpu-accelerator"]`` / ``["cloud.google.com/gke-tpu-topology"]``
  give the generation and topology.

The KubeRay TPU webhook (ai-on-gke/kuberay-tpu-webhook ``validateRayCluster``) refuses a RayCluster
whose TPU group has no topology or whose ``numOfHosts != max(prod(topology) / chipsPerHost, 1)``;
:func:`parse_raycluster` applies the same rules and raises :class:`~raytpu_lab.errors.ManifestError`.
RayJob (``spec.rayClusterSpec``) and RayService (``spec.rayClusterConfig``) manifests are read
through the RayCluster spec they embed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from raytpu_lab.errors import InvalidTopologyError, ManifestError
from raytpu_lab.tpu.labels import GKE_ACCELERATOR_SELECTOR, GKE_TOPOLOGY_SELECTOR, GKE_TPU_RESOURCE
from raytpu_lab.tpu.topology import SliceShape, normalize_version

__all__ = [
    "TPU_RESOURCE",
    "ACCELERATOR_SELECTOR",
    "TOPOLOGY_SELECTOR",
    "TpuWorkerGroup",
    "CpuWorkerGroup",
    "HeadGroup",
    "ExpectedSlice",
    "RayClusterPlan",
    "parse_raycluster",
    "raycluster_spec",
    "parse_quantity",
    "hosts_for_topology",
    "head_service_name",
]

TPU_RESOURCE = GKE_TPU_RESOURCE
ACCELERATOR_SELECTOR = GKE_ACCELERATOR_SELECTOR
TOPOLOGY_SELECTOR = GKE_TOPOLOGY_SELECTOR
_KINDS_WITH_CLUSTER_SPEC = {"RayCluster": (), "RayJob": ("rayClusterSpec",),
                            "RayService": ("rayClusterConfig",)}
_DEFAULT_PORTS = {"gcs-server": 6379, "dashboard": 8265, "client": 10001}  # KubeRay, README (e)
# Kubernetes resource.Quantity suffixes (k8s.io/apimachinery/pkg/api/resource).
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
            "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12),
            "P": Decimal(10**15), "E": Decimal(10**18)}
_QUANTITY_RE = re.compile(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))((?:[KMGTPE]i)|[numkMGTPE]|[eE][+-]?\d+)?$")


def parse_quantity(value: Any) -> Decimal:
    """A Kubernetes resource quantity as a number: ``"500m"`` -> 0.5, ``"40Gi"`` -> 42949672960.

    Same meaning as ``kubernetes.utils.parse_quantity`` (``tests/unit`` checks they agree), kept
    here so that this module imports no Kubernetes client.

    Raises:
        ValueError: Not a quantity.
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a quantity")
    if isinstance(value, int | float | Decimal):
        return Decimal(str(value))
    match = _QUANTITY_RE.match(str(value).strip())
    if not match:
        raise ValueError(f"{value!r} is not a quantity")
    number, suffix = Decimal(match.group(1)), match.group(2) or ""
    try:
        if suffix in _BINARY:
            return number * _BINARY[suffix]
        if suffix in _DECIMAL:
            return number * _DECIMAL[suffix]
        return number * Decimal(10) ** int(suffix[1:])
    except InvalidOperation as err:  # pragma: no cover - the regex admits only numbers
        raise ValueError(f"{value!r} is not a quantity") from err


def hosts_for_topology(topology: str, chips_per_host: int) -> int:
    """The webhook's host count: ``max(prod(topology dims) / chips_per_host, 1)``.

    Source: ai-on-gke/kuberay-tpu-webhook ``main.go`` (``getNumTPUHostsFromTopology``);
    e.g. v6e ``4x4`` with 4 chips -> 4, ``2x4`` with 8 -> 1, v4 ``2x2x2`` with 4 -> 2.
    """
    chips = math.prod(int(d) for d in topology.lower().split("x"))
    return max(chips // max(chips_per_host, 1), 1)


@dataclass(frozen=True)
class ExpectedSlice:
    """One slice a TPU worker group should have.

    Attributes:
        name: ``TPU_NAME`` / label ``ray.io/tpu-slice-name``: ``<group>-<replica>``, as the KubeRay
            TPU webhook names it.
        group: The worker group's ``groupName``.
        replica: Replica index (``ray.io/worker-group-replica-index``), 0-based.
        shape: Generation, topology and chips per host.
    """

    name: str
    group: str
    replica: int
    shape: SliceShape

    @property
    def hosts(self) -> int:
        """Hosts (pods) in the slice."""
        return self.shape.num_hosts


@dataclass(frozen=True)
class TpuWorkerGroup:
    """One TPU worker group of a RayCluster: ``replicas`` slices of ``num_of_hosts`` hosts each.

    Attributes:
        name: ``groupName``.
        shape: Generation and topology from the node selectors, chips per host from
            ``google.com/tpu``.
        replicas: Slices wanted now (``replicas``; 0 when unset, the CRD's default).
        min_replicas: ``minReplicas`` (slices).
        max_replicas: ``maxReplicas`` (slices).
        num_of_hosts: ``numOfHosts``: hosts per slice (checked equal to ``shape.num_hosts``).
        accelerator: The ``gke-tpu-accelerator`` selector, e.g. ``"tpu-v6e-slice"``.
        image: The Ray container's image.
        cpu: The Ray container's CPU limit (cores), or ``None``.
        memory_bytes: Its memory limit in bytes, or ``None``.
        env: Its ``env`` list as written (``value`` and ``valueFrom`` entries).
        ray_start_params: ``rayStartParams``.
        resources: The group-level ``resources`` map (added to ``ray start --resources``).
        labels: The group-level ``labels`` map (added to ``ray start --labels``).
        suspend: ``suspend``: KubeRay deletes the group's pods while true.
    """

    name: str
    shape: SliceShape
    replicas: int
    min_replicas: int
    max_replicas: int
    num_of_hosts: int
    accelerator: str
    image: str = ""
    cpu: float | None = None
    memory_bytes: int | None = None
    env: tuple[Mapping[str, Any], ...] = ()
    ray_start_params: Mapping[str, str] = field(default_factory=dict)
    resources: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    suspend: bool = False

    @property
    def chips_per_host(self) -> int:
        """``google.com/tpu`` per pod."""
        return self.shape.chips_per_host

    @property
    def pods(self) -> int:
        """Pods KubeRay creates for the group: ``replicas x numOfHosts``."""
        return 0 if self.suspend else self.replicas * self.num_of_hosts

    def expected_slices(self) -> list[ExpectedSlice]:
        """The slices ``<group>-0 .. <group>-<replicas-1>`` (none while suspended)."""
        if self.suspend:
            return []
        return [ExpectedSlice(f"{self.name}-{r}", self.name, r, self.shape)
                for r in range(self.replicas)]

    def summary(self) -> dict[str, Any]:
        """What defines the group's slices, for comparisons and display."""
        return {"group": self.name, "version": self.shape.version, "topology": self.shape.topology,
                "pod_type": self.shape.pod_type, "chips_per_host": self.chips_per_host,
                "num_of_hosts": self.num_of_hosts, "replicas": self.replicas,
                "min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
                "accelerator": self.accelerator}


@dataclass(frozen=True)
class CpuWorkerGroup:
    """A worker group without TPUs (``replicas`` pods of ``numOfHosts`` each)."""

    name: str
    replicas: int
    num_of_hosts: int = 1


@dataclass(frozen=True)
class HeadGroup:
    """The head group: image, CPU/memory limits and the ports the head service exposes.

    Attributes:
        image: The Ray head container's image.
        cpu: CPU limit (cores) or ``None``.
        memory_bytes: Memory limit in bytes or ``None``.
        ports: ``{port name: port}``; KubeRay's defaults (``gcs-server`` 6379, ``dashboard`` 8265,
            ``client`` 10001) when the container names none.
        service_name: ``headGroupSpec.headService.metadata.name`` if set, else ``None``.
    """

    image: str
    cpu: float | None
    memory_bytes: int | None
    ports: Mapping[str, int]
    service_name: str | None = None


@dataclass(frozen=True)
class RayClusterPlan:
    """What a RayCluster manifest asks for.

    Attributes:
        name: ``metadata.name`` (of the RayJob / RayService when the manifest is one).
        namespace: ``metadata.namespace``, or ``None`` when the manifest leaves it to the client.
        kind: ``"RayCluster"``, ``"RayJob"`` or ``"RayService"``.
        head: The head group.
        tpu_groups: TPU worker groups in manifest order.
        cpu_groups: Worker groups without TPUs.
    """

    name: str
    namespace: str | None
    kind: str
    head: HeadGroup
    tpu_groups: list[TpuWorkerGroup]
    cpu_groups: list[CpuWorkerGroup]

    def expected_slices(self) -> list[ExpectedSlice]:
        """Every slice of every TPU group, in manifest order."""
        return [s for g in self.tpu_groups for s in g.expected_slices()]

    @property
    def expected_hosts(self) -> dict[str, int]:
        """``{slice name: hosts}``, the form :func:`raytpu_lab.state.model.build_snapshot` takes."""
        return {s.name: s.hosts for s in self.expected_slices()}

    @property
    def service_name(self) -> str:
        """The head service: ``<cluster>-head-svc`` unless ``headService`` names another."""
        return self.head.service_name or head_service_name(self.name)

    def group(self, name: str) -> TpuWorkerGroup:
        """The TPU group called ``name``.

        Raises:
            KeyError: No TPU group of that name (the message lists them).
        """
        for g in self.tpu_groups:
            if g.name == name:
                return g
        raise KeyError(f"no TPU worker group {name!r}; groups: {[g.name for g in self.tpu_groups]}")


def head_service_name(cluster: str) -> str:
    """``<cluster>-head-svc``, KubeRay's ``utils.GenerateHeadServiceName``."""
    return f"{cluster}-head-svc"


def raycluster_spec(manifest: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    """The RayCluster ``spec`` of a manifest and the path it sits at.

    Returns:
        ``(spec, path)``: ``(manifest["spec"], "spec")`` for a RayCluster,
        ``(manifest["spec"]["rayClusterSpec"], "spec.rayClusterSpec")`` for a RayJob, and
        ``spec.rayClusterConfig`` for a RayService.

    Raises:
        ManifestError: Not a mapping, or a kind other than those three, or no cluster spec.
    """
    if not isinstance(manifest, Mapping):
        raise ManifestError(f"The manifest is a {type(manifest).__name__}, not a mapping.",
                            why="A Kubernetes manifest is one YAML/JSON object.",
                            fix="Pass one RayCluster object (a dict, or a YAML file).")
    kind = manifest.get("kind")
    if kind not in _KINDS_WITH_CLUSTER_SPEC:
        raise ManifestError(
            f"The manifest's kind is {kind!r}, not RayCluster.",
            why="Only RayCluster (ray.io/v1), and the cluster spec inside a RayJob or RayService, "
                "describe TPU worker groups.",
            fix="Pass a RayCluster manifest, e.g. one built with raytpu_lab.kuberay.build_raycluster.",
            problems=[f"kind: {kind!r}"])
    spec: Any = manifest.get("spec")
    path = "spec"
    for key in _KINDS_WITH_CLUSTER_SPEC[kind]:
        spec = spec.get(key) if isinstance(spec, Mapping) else None
        path += f".{key}"
    if not isinstance(spec, Mapping):
        raise ManifestError(f"The {kind} manifest has no {path}.",
                            why="The RayCluster spec (headGroupSpec, workerGroupSpecs) lives there.",
                            fix=f"Add {path} with a headGroupSpec and workerGroupSpecs.",
                            problems=[f"{path}: missing"])
    return spec, path


def parse_raycluster(manifest: Mapping[str, Any], *, source: str = "manifest") -> RayClusterPlan:
    """Read a RayCluster (or RayJob / RayService) manifest into its head and worker groups.

    Args:
        manifest: The object, as loaded from YAML or returned by the Kubernetes API.
        source: A name for messages, e.g. the file name.

    Returns:
        The :class:`RayClusterPlan`.

    Raises:
        ManifestError: A TPU group lacks the topology selector, names an unknown accelerator or
            a topology Ray refuses, asks for different ``google.com/tpu`` requests and limits, or
            breaks the webhook's ``numOfHosts`` rule. Every problem is listed in ``.problems``.
    """
    spec, path = raycluster_spec(manifest)
    meta = manifest.get("metadata") or {}
    problems: list[str] = []
    head = _head_group(spec.get("headGroupSpec") or {})
    tpu_groups: list[TpuWorkerGroup] = []
    cpu_groups: list[CpuWorkerGroup] = []
    for i, group in enumerate(spec.get("workerGroupSpecs") or []):
        where = f"{path}.workerGroupSpecs[{i}]"
        parsed = _worker_group(group, where, problems)
        if isinstance(parsed, TpuWorkerGroup):
            tpu_groups.append(parsed)
        elif isinstance(parsed, CpuWorkerGroup):
            cpu_groups.append(parsed)
    names = [g.name for g in tpu_groups] + [g.name for g in cpu_groups]
    problems += [f"{path}.workerGroupSpecs: groupName {n!r} used twice"
                 for n in sorted({n for n in names if names.count(n) > 1})]
    if problems:
        raise ManifestError(
            f"{source}: {len(problems)} problem(s) in the TPU worker groups: {problems[0]}"
            + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""),
            why="The KubeRay TPU webhook refuses such a RayCluster (numOfHosts must equal "
                "max(chips in topology / google.com/tpu per host, 1); TPU groups need both GKE "
                "TPU node selectors), or the topology is not one Ray 2.60 accepts.",
            fix="Fix the fields listed in .problems, or build the manifest with "
                "raytpu_lab.kuberay.build_raycluster('v6e:4x4 x2').",
            source=source, problems=problems)
    return RayClusterPlan(name=str(meta.get("name") or ""), namespace=meta.get("namespace"),
                          kind=str(manifest.get("kind")), head=head, tpu_groups=tpu_groups,
                          cpu_groups=cpu_groups)


def _container(template: Mapping[str, Any]) -> Mapping[str, Any]:
    # KubeRay runs Ray in containers[0] (utils.RayContainerIndex).
    containers = ((template or {}).get("spec") or {}).get("containers") or [{}]
    return containers[0] or {}


def _limits(container: Mapping[str, Any]) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    resources = container.get("resources") or {}
    return resources.get("limits") or {}, resources.get("requests") or {}


def _cpu_memory(container: Mapping[str, Any]) -> tuple[float | None, int | None]:
    limits, requests = _limits(container)
    cpu = limits.get("cpu", requests.get("cpu"))
    memory = limits.get("memory", requests.get("memory"))
    try:
        cpu_cores = float(parse_quantity(cpu)) if cpu is not None else None
        memory_bytes = int(parse_quantity(memory)) if memory is not None else None
    except ValueError:
        return None, None  # the schema check reports malformed quantities
    return cpu_cores, memory_bytes


def _head_group(head: Mapping[str, Any]) -> HeadGroup:
    container = _container(head.get("template") or {})
    ports = {str(p.get("name")): int(p["containerPort"]) for p in container.get("ports") or []
             if p.get("name") and p.get("containerPort")}
    cpu, memory = _cpu_memory(container)
    service = ((head.get("headService") or {}).get("metadata") or {}).get("name")
    return HeadGroup(image=str(container.get("image") or ""), cpu=cpu, memory_bytes=memory,
                     ports=ports or dict(_DEFAULT_PORTS), service_name=service)


def _int_field(group: Mapping[str, Any], key: str, default: int) -> int:
    value = group.get(key, default)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _worker_group(group: Mapping[str, Any], where: str, problems: list[str]
                  ) -> TpuWorkerGroup | CpuWorkerGroup | None:
    if not isinstance(group, Mapping):
        problems.append(f"{where}: not a mapping")
        return None
    name = str(group.get("groupName") or "")
    replicas = _int_field(group, "replicas", 0)
    hosts = _int_field(group, "numOfHosts", 1)
    template = group.get("template") or {}
    container = _container(template)
    limits, requests = _limits(container)
    selectors = ((template.get("spec") or {}).get("nodeSelector")) or {}
    if TPU_RESOURCE not in limits and TPU_RESOURCE not in requests:
        if selectors.get(ACCELERATOR_SELECTOR):
            problems.append(f"{where}: nodeSelector {ACCELERATOR_SELECTOR} set but the Ray container "
                            f"requests no {TPU_RESOURCE}")
        return CpuWorkerGroup(name, replicas, hosts)
    chips_text = limits.get(TPU_RESOURCE, requests.get(TPU_RESOURCE))
    if TPU_RESOURCE in limits and TPU_RESOURCE in requests and \
            str(limits[TPU_RESOURCE]) != str(requests[TPU_RESOURCE]):
        problems.append(f"{where}: {TPU_RESOURCE} requests ({requests[TPU_RESOURCE]}) differ from "
                        f"limits ({limits[TPU_RESOURCE]}); Kubernetes needs them equal")
    try:
        chips = int(parse_quantity(chips_text))
    except ValueError:
        problems.append(f"{where}: {TPU_RESOURCE} {chips_text!r} is not a whole number of chips")
        return None
    accelerator = str(selectors.get(ACCELERATOR_SELECTOR) or "")
    topology = str(selectors.get(TOPOLOGY_SELECTOR) or "")
    if not accelerator:
        problems.append(f"{where}.template.spec.nodeSelector: no {ACCELERATOR_SELECTOR} "
                        "(e.g. tpu-v6e-slice)")
    if not topology:
        problems.append(f"{where}.template.spec.nodeSelector: no {TOPOLOGY_SELECTOR} (e.g. 4x4); "
                        "the TPU webhook refuses a TPU group without a topology")
    if not accelerator or not topology:
        return None
    try:
        shape = SliceShape(normalize_version(accelerator), topology, chips)
    except InvalidTopologyError as err:
        problems.append(f"{where}: {accelerator} {topology} with {chips} chips per host: {err.what}")
        return None
    want = hosts_for_topology(topology, chips)
    if hosts != want:
        problems.append(f"{where}.numOfHosts: {hosts}, but {shape.version} {topology} with {chips} "
                        f"chips per host has {want} host(s) (the TPU webhook requires "
                        f"numOfHosts == {want})")
    cpu, memory = _cpu_memory(container)
    return TpuWorkerGroup(
        name=name, shape=shape, replicas=replicas,
        min_replicas=_int_field(group, "minReplicas", 0),
        max_replicas=_int_field(group, "maxReplicas", 2**31 - 1),
        num_of_hosts=hosts, accelerator=accelerator, image=str(container.get("image") or ""),
        cpu=cpu, memory_bytes=memory, env=tuple(container.get("env") or ()),
        ray_start_params={str(k): str(v) for k, v in (group.get("rayStartParams") or {}).items()},
        resources={str(k): str(v) for k, v in (group.get("resources") or {}).items()},
        labels={str(k): str(v) for k, v in (group.get("labels") or {}).items()},
        suspend=bool(group.get("suspend", False)))
