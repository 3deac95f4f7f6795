"""Names raytpu_lab shares with Ray, GKE and KubeRay, each defined once; pure (no imports).

Ray 2.60 derives the ``ray.io/tpu-*`` node labels from the environment GKE gives a TPU pod
(``TPU_NAME``, ``TPU_WORKER_ID``, ``TPU_TOPOLOGY``, ``TPU_ACCELERATOR_TYPE``); GKE schedules TPU
pods by the ``cloud.google.com/gke-tpu-*`` node selectors and the ``google.com/tpu`` resource;
KubeRay labels the pods it creates with ``ray.io/group`` and the replica indices. A Ray upgrade or
a KubeRay release that renames one of them breaks here, in one place.
"""

from __future__ import annotations

__all__ = [
    "LABEL_SLICE",
    "LABEL_WORKER",
    "LABEL_TOPOLOGY",
    "LABEL_POD_TYPE",
    "LABEL_ACCELERATOR",
    "TPU_LABELS",
    "GKE_TPU_RESOURCE",
    "GKE_ACCELERATOR_SELECTOR",
    "GKE_TOPOLOGY_SELECTOR",
    "KUBERAY_LABEL_GROUP",
    "KUBERAY_LABEL_REPLICA",
    "KUBERAY_LABEL_HOST",
    "RESERVATION_PREFIX",
]

# Ray node labels (set by Ray from GKE's TPU environment).
LABEL_SLICE = "ray.io/tpu-slice-name"
"""The slice a host belongs to (GKE's ``TPU_NAME``)."""
LABEL_WORKER = "ray.io/tpu-worker-id"
"""A host's 0-based index in its slice (``TPU_WORKER_ID``; 0 is the head)."""
LABEL_TOPOLOGY = "ray.io/tpu-topology"
"""The slice's topology, e.g. ``"4x4"`` (``TPU_TOPOLOGY``)."""
LABEL_POD_TYPE = "ray.io/tpu-pod-type"
"""The pod type, e.g. ``"v6e-16"`` (``TPU_ACCELERATOR_TYPE``)."""
LABEL_ACCELERATOR = "ray.io/accelerator-type"
"""Ray's accelerator type, e.g. ``"TPU-V6E"``."""
TPU_LABELS = (LABEL_SLICE, LABEL_WORKER, LABEL_TOPOLOGY, LABEL_POD_TYPE)
"""A node carrying any of these is meant as a TPU host."""

# GKE.
GKE_TPU_RESOURCE = "google.com/tpu"
"""The Kubernetes extended resource counting a pod's TPU chips."""
GKE_ACCELERATOR_SELECTOR = "cloud.google.com/gke-tpu-accelerator"
"""Node selector naming the generation, e.g. ``"tpu-v6e-slice"``."""
GKE_TOPOLOGY_SELECTOR = "cloud.google.com/gke-tpu-topology"
"""Node selector naming the slice topology, e.g. ``"4x4"``."""

# KubeRay pod labels.
KUBERAY_LABEL_GROUP = "ray.io/group"
"""The worker group of a pod."""
KUBERAY_LABEL_REPLICA = "ray.io/worker-group-replica-index"
"""Which replica (slice) of its worker group a pod belongs to."""
KUBERAY_LABEL_HOST = "ray.io/replica-host-index"
"""A pod's host index in its multi-host replica (the slice's worker id)."""

# Ours.
RESERVATION_PREFIX = "raytpu:"
"""Placement groups named ``"raytpu:<name>"`` are reservation ``<name>``."""
