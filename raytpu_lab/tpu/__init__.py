"""TPU topology core: generations, slice shapes, hosts, chips and ICI links. Pure: stdlib only.

Glossary, in the words Ray and Google Cloud use (Ray 2.60 ``ray.util.tpu`` and
``ray._private.accelerators.tpu``; Google Cloud "TPU system architecture"; GKE "About TPUs in GKE"):

chip
    One TPU device (ASIC) with its HBM. Ray counts chips in the ``TPU`` resource: a host with
    4 chips has ``{"TPU": 4}``. GKE requests them as ``google.com/tpu``.
TensorCore (core)
    Compute unit inside a chip: 2 per chip on v2, v3, v4, v5p and v7x, 1 on v5e and v6e
    (Ray's ``get_tpu_cores_per_chip``). Pod types count cores, not chips.
host
    A TPU VM: one machine with its chips (usually 4; v5e/v6e single-host slices up to 8). On
    GKE a host is one pod, and in Ray one node.
slice
    Chips joined by ICI, provisioned and scheduled as one unit, spanning one or more hosts.
    Ray names it by ``TPU_NAME`` (label ``ray.io/tpu-slice-name``) and gives every host of the
    slice the resource ``<slice name>: 1``.
topology
    The slice's shape in chips per axis: ``"4x4"`` (2-D: v2, v3, v5e, v6e) or ``"2x2x2"`` (3-D:
    v4, v5p, v7x). GKE: ``cloud.google.com/gke-tpu-topology`` / ``TPU_TOPOLOGY``; Ray: label
    ``ray.io/tpu-topology``.
accelerator version
    The generation as Ray spells it: ``v2``, ``v3``, ``v4``, ``v5p``, ``v5litepod`` (Google's
    "v5e"), ``v6e`` (Trillium), ``v7x`` (Ironwood; GKE spells it ``tpu7x``).
accelerator type
    Ray's resource/label for the generation: ``TPU-V6E`` (``accelerator_type:TPU-V6E``, label
    ``ray.io/accelerator-type``); what ``ScalingConfig(accelerator_type=...)`` takes.
pod type
    ``<version>-<TensorCores in the slice>``: ``v6e-16`` for v6e 4x4, ``v4-16`` for v4 2x2x2.
    GKE sets it as ``TPU_ACCELERATOR_TYPE`` (``tpu7x-8`` for v7x 2x2x1, which Ray reads as
    ``v7x-8``); Ray's label is ``ray.io/tpu-pod-type``.
worker id
    A host's 0-based index in its slice (``TPU_WORKER_ID``, label ``ray.io/tpu-worker-id``).
head
    Worker 0 of a slice. Only it carries the resource ``TPU-<pod type>-head`` (``TPU-v6e-16-head``),
    which Ray uses to reserve a whole slice atomically.
ICI
    Inter-chip interconnect: the direct chip-to-chip links inside a slice (a mesh or torus).
DCN
    Data-center network: how slices (through their hosts) talk to each other in multi-slice jobs.
chips_per_host vs devices
    ``chips_per_host`` is physical chips on a host (Ray's ``TPU`` resource). Devices are what
    JAX counts (``jax.device_count()``): one per chip on v4/v5p (megacore) and v5e/v6e, two
    per chip on v2/v3 and v7x. See ``SliceShape.devices_per_host``.

Example::

    >>> from raytpu_lab.tpu import parse_spec
    >>> parse_spec("v6e:4x4").pod_type
    'v6e-16'
"""

from __future__ import annotations

from raytpu_lab.tpu.generations import GENERATIONS, Generation, normalize_version, valid_topologies
from raytpu_lab.tpu.topology import (
    Coord,
    SliceShape,
    ici_links,
    parse_spec,
    slice_shape,
    split_pod_type,
)
from raytpu_lab.tpu.unknown import UnknownShape, unknown_shape

__all__ = [
    "Coord",
    "Generation",
    "GENERATIONS",
    "SliceShape",
    "UnknownShape",
    "unknown_shape",
    "normalize_version",
    "valid_topologies",
    "slice_shape",
    "parse_spec",
    "split_pod_type",
    "ici_links",
]
