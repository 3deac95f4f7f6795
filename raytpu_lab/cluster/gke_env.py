"""The environment a TPU worker pod gets on GKE from KubeRay, the TPU device plugin and the webhook.

Pure: no Ray, no I/O. The emulator starts each Ray node with exactly this environment so that Ray's
own TPU code (``ray._private.accelerators.tpu``) derives the node labels and resources itself; we
never set ``ray.io/tpu-*`` labels or ``TPU-<pod type>-head`` resources by hand.

Sources (see ``shared/kuberay/README.md`` for pinned commits):
- KubeRay operator ``controllers/ray/common/pod.go`` (``RAY_*`` variables, the ``ray start`` flags),
- the GKE TPU device plugin (``TPU_ACCELERATOR_TYPE``, ``TPU_TOPOLOGY``, bounds, ``TPU_SKIP_MDS_QUERY``),
- ai-on-gke/kuberay-tpu-webhook ``main.go`` (``TPU_WORKER_ID``, ``TPU_NAME``, ``TPU_WORKER_HOSTNAMES``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from raytpu_lab.tpu.labels import KUBERAY_LABEL_GROUP, KUBERAY_LABEL_HOST, KUBERAY_LABEL_REPLICA
from raytpu_lab.tpu.topology import SliceShape

__all__ = [
    "group_name", "slice_name", "pod_name", "head_environment", "tpu_host_environment",
    "emulated_jax_environment", "emulated_torch_xla_environment", "EMULATED_LABEL",
    "emulated_slice_environment", "SLICE_COORDINATOR_ENV", "SLICE_HOST_IPS_ENV",
    "worker_pod_labels", "container_environment",
]

EMULATED_LABEL = "raytpu.dev/emulated-tpu"
"""Ray node label (value ``"true"``) the emulator gives every emulated TPU host, so code on the
driver can tell an emulated slice from a real one (e.g. to run PyTorch/XLA on CPU with gloo).
Real GKE hosts never carry it; Ray's own ``ray.io/*`` TPU labels stay Ray's to derive."""

_METRICS_BASE_PORT = 8431  # TPU_RUNTIME_METRICS_PORTS: one port per chip, from 8431 (device plugin)


def group_name(shape: SliceShape) -> str:
    """The KubeRay worker-group name we give slices of ``shape``, e.g. ``"tpu-v6e-4x4"``."""
    return f"tpu-{shape.version}-{shape.topology}"


def slice_name(group: str, replica: int) -> str:
    """``TPU_NAME`` as the KubeRay TPU webhook sets it: ``<group>-<replica index>``."""
    return f"{group}-{replica}"


def pod_name(cluster: str, group: str, replica: int, worker_id: int) -> str:
    """A stable stand-in for the pod name KubeRay generates (``<cluster>-<group>-worker-<suffix>``)."""
    return f"{cluster}-{group}-worker-r{replica}h{worker_id}"


def head_environment(*, cluster: str, gcs_port: int, namespace: str = "default") -> dict[str, str]:
    """Environment of the Ray head pod as KubeRay sets it (``RAY_ADDRESS`` is ``127.0.0.1:<port>``).

    Ray code that looks for "the" cluster (``address="auto"``, e.g. Ray Train's placement-group
    cleaner using the state API) reads ``RAY_ADDRESS``; without it, it scans the machine and fails
    when several local clusters run.
    """
    return {
        "RAY_CLUSTER_NAME": cluster,
        "RAY_CLUSTER_NAMESPACE": namespace,
        "RAY_CLOUD_INSTANCE_ID": f"{cluster}-head",
        "RAY_NODE_TYPE_NAME": "headgroup",
        "RAY_PORT": str(gcs_port),
        "RAY_ADDRESS": f"127.0.0.1:{gcs_port}",
        "RAY_USAGE_STATS_KUBERAY_IN_USE": "1",
    }


def tpu_host_environment(
    shape: SliceShape,
    *,
    cluster: str,
    replica: int,
    worker_id: int,
    head_host: str,
    gcs_port: int,
    namespace: str = "default",
    group: str | None = None,
) -> dict[str, str]:
    """Environment of one TPU host pod, as GKE + KubeRay would give it.

    Args:
        shape: The slice's generation and topology.
        cluster: The RayCluster name.
        replica: The slice's replica index within its worker group (0-based).
        worker_id: The host's index within the slice (``TPU_WORKER_ID``; 0 is the slice head).
        head_host: Host name or IP of the Ray head (the head service on GKE).
        gcs_port: The head's GCS port (6379 on KubeRay).
        namespace: The Kubernetes namespace.
        group: The worker group's ``groupName`` (``RAY_NODE_TYPE_NAME``; ``TPU_NAME`` is
            ``<group>-<replica>``); :func:`group_name` of ``shape`` when ``None``.

    Returns:
        ``{variable: value}``; merge it over the parent environment before ``ray start``.
    """
    if not 0 <= worker_id < shape.num_hosts:
        raise ValueError(f"worker_id {worker_id} outside 0..{shape.num_hosts - 1} for {shape.pod_type}")
    group = group or group_name(shape)
    tpu_name = slice_name(group, replica)
    pod = pod_name(cluster, group, replica, worker_id)
    head_svc = f"{cluster}-head-svc"
    env = {
        # KubeRay operator (layer 1)
        "FQ_RAY_IP": head_host,
        "RAY_IP": head_svc,
        "RAY_CLUSTER_NAME": cluster,
        "RAY_CLUSTER_NAMESPACE": namespace,
        "RAY_CLOUD_INSTANCE_ID": pod,
        "RAY_NODE_TYPE_NAME": group,
        "RAY_PORT": str(gcs_port),
        "RAY_ADDRESS": f"{head_host}:{gcs_port}",
        "RAY_USAGE_STATS_KUBERAY_IN_USE": "1",
        "RAY_DASHBOARD_ENABLE_K8S_DISK_USAGE": "1",
        # GKE TPU device plugin (layer 2)
        "TPU_ACCELERATOR_TYPE": shape.gke_accelerator_type,
        "TPU_TOPOLOGY": shape.topology,
        "TPU_HOST_BOUNDS": shape.host_bounds_env,
        "TPU_CHIPS_PER_HOST_BOUNDS": shape.chips_per_host_bounds_env,
        "TPU_SKIP_MDS_QUERY": "true",
        "TPU_RUNTIME_METRICS_PORTS": ",".join(
            str(_METRICS_BASE_PORT + i) for i in range(shape.chips_per_host)
        ),
        # KubeRay TPU webhook (layer 3)
        "TPU_WORKER_ID": str(worker_id),
        "TPU_NAME": tpu_name,
    }
    if shape.num_hosts > 1:
        env["TPU_WORKER_HOSTNAMES"] = ",".join(
            f"{group}-{replica}-{h}.{cluster}-headless" for h in range(shape.num_hosts)
        )
    else:
        env["TPU_WORKER_HOSTNAMES"] = "localhost"
    return env


def emulated_jax_environment(shape: SliceShape) -> dict[str, str]:
    """What makes JAX on an emulated host look like its chips: CPU, one XLA device per TPU device
    (one per chip; two per chip on v7x, whose TensorCores JAX shows as separate devices).

    Only the emulator adds this; on a real TPU pod JAX finds the chips itself.
    """
    return {
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={shape.devices_per_host}",
    }


SLICE_COORDINATOR_ENV = "RAYTPU_SLICE_COORDINATOR"
"""``<worker 0's address>:<port>``: where JAX's coordination service of an emulated slice runs
(on a TPU VM the TPU runtime derives it from ``TPU_WORKER_HOSTNAMES``, whose GKE names do not
resolve on this machine)."""
SLICE_HOST_IPS_ENV = "RAYTPU_SLICE_HOST_IPS"
"""The slice's host addresses in worker-id order, comma-separated (emulator only)."""


def emulated_slice_environment(shape: SliceShape, *, coordinator: str,
                               host_ips: list[str]) -> dict[str, str]:
    """What lets JAX in a process holding an emulated host's chips see the whole slice, as the TPU
    runtime does on a TPU VM: the slice's coordinator address and its hosts' addresses.

    Only the emulator adds this (with its start-up hook, :mod:`raytpu_lab.cluster.jax_slice`).
    """
    return {SLICE_COORDINATOR_ENV: coordinator, SLICE_HOST_IPS_ENV: ",".join(host_ips),
            "RAYTPU_CHIPS_PER_HOST": str(shape.chips_per_host)}


def emulated_torch_xla_environment() -> dict[str, str]:
    """What makes torch_xla on an emulated host use the CPU: ``PJRT_DEVICE=CPU`` (one PJRT CPU
    device per process, i.e. per chip-worker).

    Only the emulator adds this; on a real TPU host torch_xla uses the chip (``PJRT_DEVICE=TPU``).
    """
    return {"PJRT_DEVICE": "CPU"}


def worker_pod_labels(shape: SliceShape, *, cluster: str, group: str, replica: int,
                      worker_id: int) -> dict[str, str]:
    """Labels KubeRay puts on a TPU worker pod (``labelPod``; ``RayMultiHostIndexing`` on).

    ``ray.io/worker-group-replica-name`` is ``<group>-<5 random chars>`` on GKE; here the replica
    index stands in for the random part, so it is stable.
    """
    labels = {
        "ray.io/is-ray-node": "yes", "ray.io/cluster": cluster, "ray.io/node-type": "worker",
        KUBERAY_LABEL_GROUP: group, "ray.io/identifier": f"{cluster}-worker",
        "app.kubernetes.io/name": "kuberay", "app.kubernetes.io/created-by": "kuberay-operator",
        KUBERAY_LABEL_REPLICA: str(replica),
    }
    if shape.num_hosts > 1:
        labels["ray.io/worker-group-replica-name"] = f"{group}-r{replica:04d}"
        labels[KUBERAY_LABEL_HOST] = str(worker_id)
    return labels


_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_INDEXED_FIELD = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


def container_environment(
    entries: Iterable[Mapping[str, Any]], *, pod: str, namespace: str, labels: Mapping[str, str],
    node_ip: str = "127.0.0.1", pod_ip: str = "127.0.0.1",
) -> tuple[dict[str, str], list[str]]:
    """A container's ``env`` list resolved as the kubelet would, for one pod.

    ``value`` entries expand ``$(VAR)`` references to variables defined earlier in the list
    (``$$`` is a literal ``$``; unknown references stay as written, as Kubernetes leaves them).
    ``valueFrom.fieldRef`` reads the pod's own fields (``metadata.name``, ``metadata.namespace``,
    ``metadata.labels['k']``, ``status.hostIP``, ``status.podIP``, ...). Secrets, config maps and
    resource fields cannot be read off a cluster, so those variables are left out and named.

    Args:
        entries: The ``env`` list of the container spec.
        pod: The pod's name.
        namespace: Its namespace.
        labels: Its labels.
        node_ip: ``status.hostIP``.
        pod_ip: ``status.podIP``.

    Returns:
        ``({name: value}, [skipped variable names with the reason])``.
    """
    fields = {"metadata.name": pod, "metadata.namespace": namespace, "metadata.uid": pod,
              "spec.nodeName": f"node-{pod}", "spec.serviceAccountName": "default",
              "status.hostIP": node_ip, "status.hostIPs": node_ip, "status.podIP": pod_ip,
              "status.podIPs": pod_ip}
    env: dict[str, str] = {}
    skipped: list[str] = []
    for entry in entries:
        name = str(entry.get("name") or "")
        if not name:
            continue
        if "valueFrom" not in entry:
            env[name] = _VAR_REF.sub(lambda m: "$" if m.group(0) == "$$" else
                                     env.get(m.group(1), m.group(0)), str(entry.get("value", "")))
            continue
        source = entry.get("valueFrom") or {}
        path = str((source.get("fieldRef") or {}).get("fieldPath", ""))
        indexed = _INDEXED_FIELD.match(path)
        if path in fields:
            env[name] = fields[path]
        elif indexed and indexed.group(1) == "labels":
            env[name] = str(labels.get(indexed.group(2), ""))
        elif indexed:
            env[name] = ""
        else:
            kind = next(iter(source), "valueFrom")
            skipped.append(f"{name} ({kind} cannot be resolved off a cluster)")
    return env, skipped
