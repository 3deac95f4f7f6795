"""What a PyTorch/XLA training function calls inside a Ray Train worker (one worker per chip).

::

    from raytpu_lab.train import torch_xla_utils as txu

    def train_loop_per_worker(config):
        dev = txu.device()                       # this worker's XLA device (its chip)
        model = Net().to(dev)
        txu.broadcast_parameters(model)          # every rank starts from rank 0's weights
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(config["steps"]):
            loss = loss_fn(model(x.to(dev)), y.to(dev))
            opt.zero_grad(); loss.backward()
            txu.optimizer_step(opt, model)       # average gradients over all ranks, step, sync
            ray.train.report({"step": step, "loss": loss.item()})

The same function runs on TPUs and on the emulator; what differs is set up by
:mod:`raytpu_lab.train.torch_backend` before it starts:

- On TPUs (``PJRT_DEVICE=TPU``, process group ``xla``): the device is the worker's chip;
  gradients are averaged with torch_xla's own ``xm.all_reduce`` (over ICI), graphs cut with
  ``torch_xla.sync()``. With ``tpu_dist`` (torch_tpu) the averaging is ``torch.distributed
  .all_reduce`` on the process group. Not exercised in this repository (no TPU here).
- On the emulator (``PJRT_DEVICE=CPU``, process group ``gloo``): the device is a PJRT CPU device,
  one per worker. gloo cannot read XLA tensors, so gradients are flattened, copied to the host
  once, all-reduced with gloo and copied back - the plain way to emulate data-parallel sync; the
  metrics then show one transfer each way per step that a TPU run would not have.

Imports torch and torch_xla lazily, so a notebook can import this module without them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

__all__ = [
    "broadcast_parameters", "device", "optimizer_step", "parameter_digest",
    "sync_gradients", "xla_metrics",
]

_compiles_per_step: list[int] = []


def device() -> Any:
    """This worker's XLA device (``torch_xla.device()``): its TPU chip, or a PJRT CPU device."""
    import torch_xla

    return torch_xla.device()


def _world() -> tuple[Any, int]:
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return dist, 1
    return dist, dist.get_world_size()


def _through_host(dist: Any) -> bool:
    # gloo (the emulator) only moves host tensors; xla and tpu_dist move device tensors.
    return bool(dist.get_backend() == "gloo")


def sync_gradients(model: Any) -> None:
    """Average the gradients of ``model``'s parameters over every rank, in place.

    On ``xla``: ``xm.all_reduce(REDUCE_SUM, grads, scale=1/world)``. On ``tpu_dist``: one
    ``all_reduce`` per gradient. On ``gloo``: one flattened host copy, ``all_reduce``, copy back.
    A no-op with one worker.
    """

    dist, world = _world()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if world == 1 or not grads:
        return
    backend = dist.get_backend()
    if backend == "xla":
        import torch_xla.core.xla_model as xm

        xm.all_reduce(xm.REDUCE_SUM, grads, scale=1.0 / world)
    elif _through_host(dist):
        def mean(flat: Any) -> None:
            dist.all_reduce(flat)
            flat /= world

        _on_host([g.detach() for g in grads], mean)
    else:
        for g in grads:
            dist.all_reduce(g)
            g /= world


def broadcast_parameters(model: Any, src: int = 0) -> None:
    """Give every rank rank ``src``'s parameters (call once, after moving the model to the device)."""

    dist, world = _world()
    if world == 1:
        return
    params = [p.data for p in model.parameters()]
    if _through_host(dist):
        _on_host(params, lambda flat: dist.broadcast(flat, src))
    else:
        for p in params:
            dist.broadcast(p, src)
    _sync()


def optimizer_step(optimizer: Any, model: Any) -> None:
    """Average gradients over all ranks, ``optimizer.step()``, then run the step's graph.

    The graph is cut with ``torch_xla.sync()`` (the old ``xm.mark_step()``); the compile count
    after each call is kept for :func:`xla_metrics` (``xla_compiles_per_step``).
    """
    sync_gradients(model)
    optimizer.step()
    _sync()
    _compiles_per_step.append(_metric("CompileTime")[0])


def _sync() -> None:
    import torch_xla

    torch_xla.sync()


def _metric(name: str) -> tuple[int, float]:
    """``(count, total seconds)`` of a torch_xla metric; zeros before its first sample."""
    import torch_xla.debug.metrics as met

    data = met.metric_data(name)  # type: ignore[no-untyped-call]
    if not data:
        return 0, 0.0
    return int(data[0]), float(data[1]) / 1e9  # accumulator in nanoseconds


def xla_metrics() -> dict[str, Any]:
    """This process's torch_xla metrics (``torch_xla.debug.metrics``), JSON-able, for a report.

    Keys: ``xla_{compile,execute,transfer_to_device,transfer_from_device}_{count,time_s}`` and
    ``xla_compiles_per_step`` (see :mod:`raytpu_lab.train.xla_profile`).
    """
    out: dict[str, Any] = {}
    for key, name in (("compile", "CompileTime"), ("execute", "ExecuteTime"),
                      ("transfer_to_device", "TransferToDeviceTime"),
                      ("transfer_from_device", "TransferFromDeviceTime")):
        count, total_s = _metric(name)
        out[f"xla_{key}_count"] = count
        out[f"xla_{key}_time_s"] = round(total_s, 6)
    out["xla_compiles_per_step"] = list(_compiles_per_step)
    return out


def parameter_digest(model: Any) -> str:
    """SHA-256 of ``model``'s parameters as host bytes: equal on every rank iff weights are equal."""
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _reset() -> None:
    """Forget the previous run's per-step compile counts (workers may be reused)."""
    _compiles_per_step.clear()


def _on_host(tensors: list[Any], collective: Callable[[Any], Any]) -> None:
    """Run ``collective`` on one flat CPU copy of ``tensors`` (gloo takes no XLA tensors), then
    write the result back into them in place."""
    import torch

    flat = torch.cat([t.reshape(-1) for t in tensors]).cpu()
    collective(flat)
    back = flat.to(tensors[0].device)
    for t, value in zip(tensors, torch.split(back, [t.numel() for t in tensors]), strict=True):
        t.copy_(value.view_as(t))
