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

from raytpu_lab.tpu.topology import SliceShape

__all__ = [
    "group_name", "slice_name", "pod_name", "head_environment", "tpu_host_environment",
    "emulated_jax_environment", "emulated_torch_xla_environment", "EMULATED_LABEL",
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

    Returns:
        ``{variable: value}``; merge it over the parent environment before ``ray start``.
    """
    if not 0 <= worker_id < shape.num_hosts:
        raise ValueError(f"worker_id {worker_id} outside 0..{shape.num_hosts - 1} for {shape.pod_type}")
    group = group_name(shape)
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


def emulated_torch_xla_environment() -> dict[str, str]:
    """What makes torch_xla on an emulated host use the CPU: ``PJRT_DEVICE=CPU`` (one PJRT CPU
    device per process, i.e. per chip-worker).

    Only the emulator adds this; on a real TPU host torch_xla uses the chip (``PJRT_DEVICE=TPU``).
    """
    return {"PJRT_DEVICE": "CPU"}
