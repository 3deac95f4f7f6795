"""The process group of a PyTorch/XLA run: a ``TorchConfig`` whose backend sets up torch_xla.

Why not Ray's own ``TorchConfig`` backend (checked on Ray 2.60.0): with ``use_tpu=True`` and
``resources_per_worker={"TPU": 1}``, its ``on_start`` calls ``ray.train.torch.get_device()`` in
every worker, which for a TPU worker asks Ray's ``TPUTorchDeviceManager`` and raises
``RuntimeError: Using TPUTorchDeviceManager but torch_tpu is not available`` unless Google's
``torch_tpu`` package is installed - whatever ``TorchConfig(backend=...)`` says. It also never
imports ``torch_xla.distributed.xla_backend``, which registers the ``xla`` backend. So this
module gives ``TorchTrainer`` a :class:`TorchXlaConfig` (a ``TorchConfig``, so Ray treats the
run as Torch) whose :class:`ray.train.backend.Backend` does, in each worker:

1. ``MASTER_ADDR``/``MASTER_PORT`` from rank 0 and the torchrun variables (``RANK``,
   ``LOCAL_RANK``, ``WORLD_SIZE``...) from ``ray.train.get_context()``, as Ray's does;
2. ``PJRT_DEVICE``: ``TPU`` on TPUs, ``CPU`` on the emulator;
3. for ``xla`` on TPUs, torch_xla's own multi-process PJRT setup
   (``torch_xla._internal.pjrt.initialize_multiprocess``, what its ``xla://`` rendezvous does
   under torchrun), with the chip Ray assigned as the local index; Ray's one-chip bounds
   (``TPU_CHIPS_PER_HOST_BOUNDS``/``TPU_HOST_BOUNDS`` = ``1,1,1``) are dropped so the chips of
   the slice form one PJRT world. Not exercised here: there is no TPU in this repository's CI;
4. ``torch.distributed.init_process_group(backend, init_method="env://")``; ``tpu_dist`` is
   loaded through ``torch_tpu._loader.load()`` as Ray does.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import ray
from ray.train.backend import Backend
from ray.train.torch import TorchConfig

__all__ = ["TorchXlaConfig"]

_SHUTDOWN_TIMEOUT_S = 30.0
_RAY_ONE_CHIP_BOUNDS = ("TPU_CHIPS_PER_HOST_BOUNDS", "TPU_HOST_BOUNDS")


@dataclass
class TorchXlaConfig(TorchConfig):
    """``TorchConfig`` for PyTorch/XLA workers, one per chip.

    Attributes:
        backend: Process-group backend: ``"xla"``, ``"tpu_dist"`` or ``"gloo"``.
        pjrt_device: ``"TPU"`` on TPUs, ``"CPU"`` on the emulator (torch_xla's ``PJRT_DEVICE``).
    """

    pjrt_device: str = "TPU"

    @property
    def backend_cls(self) -> type[Backend]:
        return _TorchXlaBackend


class _TorchXlaBackend(Backend):
    def on_start(self, worker_group: Any, backend_config: Any) -> None:
        addr, port = worker_group.execute_single(0, _address_and_port)
        worker_group.execute(_init_worker, addr=addr, port=port, backend=backend_config.backend,
                             pjrt_device=backend_config.pjrt_device,
                             timeout_s=backend_config.timeout_s)

    def on_shutdown(self, worker_group: Any, backend_config: Any) -> None:
        refs = worker_group.execute_async(_shutdown_worker)
        try:
            ray.get(refs, timeout=_SHUTDOWN_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            pass  # the workers are being torn down anyway


def _address_and_port() -> tuple[str, int]:
    addr = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    with socket.socket() as s:
        s.bind(("", 0))
        return addr, int(s.getsockname()[1])


def _init_worker(addr: str, port: int, backend: str, pjrt_device: str, timeout_s: int) -> None:
    import torch.distributed as dist

    from raytpu_lab.train import torch_xla_utils

    ctx = ray.train.get_context()
    os.environ.update({
        "MASTER_ADDR": addr, "MASTER_PORT": str(port),
        "RANK": str(ctx.get_world_rank()), "WORLD_SIZE": str(ctx.get_world_size()),
        "LOCAL_RANK": str(ctx.get_local_rank()), "LOCAL_WORLD_SIZE": str(ctx.get_local_world_size()),
        "NODE_RANK": str(ctx.get_node_rank()), "PJRT_DEVICE": pjrt_device,
    })
    torch_xla_utils._reset()
    if backend == "xla":
        import torch_xla.distributed.xla_backend  # noqa: F401  registers "xla" with torch.distributed

        if pjrt_device == "TPU":
            _join_pjrt_world(ctx.get_local_world_size())
    elif backend == "tpu_dist":
        import torch_tpu._loader

        torch_tpu._loader.load()
    dist.init_process_group(backend=backend, init_method="env://", rank=ctx.get_world_rank(),
                            world_size=ctx.get_world_size(), timeout=timedelta(seconds=timeout_s))


def _join_pjrt_world(local_world_size: int) -> None:
    from torch_xla._internal import pjrt

    chips = ray.get_runtime_context().get_accelerator_ids().get("TPU", [])
    local_index = int(chips[0]) if len(chips) == 1 else ray.train.get_context().get_local_rank()
    for name in _RAY_ONE_CHIP_BOUNDS:
        os.environ.pop(name, None)
    pjrt.initialize_multiprocess(local_index, local_world_size)


def _shutdown_worker() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
