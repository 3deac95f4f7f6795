"""Device-centric PyTorch/XLA runs: Ray Train's ``TorchTrainer``, one worker per TPU chip.

``TorchTrainer(ScalingConfig(use_tpu=True, topology, accelerator_type, num_workers=chips x
slices, resources_per_worker={"TPU": 1}))``: Ray reserves the slices with the same
``SlicePlacementGroup`` as for JAX and puts one worker on each chip (Ray exports the chip as
``TPU_VISIBLE_CHIPS``). The run goes through :func:`raytpu_lab.train.launch.start_run`, so its
reports, placement, logs and Stop reach the same run dashboard as a JAX run.

The process group is set explicitly (:class:`~raytpu_lab.train.torch_backend.TorchXlaConfig`),
from where the run lands, never from the user's cell:

============  ==============================  ====================================
cluster       asked ``backend``               runs
============  ==============================  ====================================
TPUs          ``None`` / ``"xla"``            torch_xla ``xla``, ``PJRT_DEVICE=TPU``
TPUs          ``"tpu_dist"`` / ``"gloo"``     that backend, ``PJRT_DEVICE=TPU``
emulator      any                             ``gloo``, ``PJRT_DEVICE=CPU``
============  ==============================  ====================================

The emulator is recognised by the node label :data:`~raytpu_lab.cluster.gke_env.EMULATED_LABEL`
that it gives its hosts. Where each rank ran comes from the worker tap's placement row (as for
JAX); when its function ends each worker also sends torch_xla's metrics as its worker summary
(:mod:`raytpu_lab.train.xla_profile`), apart from the run's metric reports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from raytpu_lab.cluster.gke_env import EMULATED_LABEL
from raytpu_lab.state.snapshot import ClusterSnapshot
from raytpu_lab.tpu.topology import SliceShape
from raytpu_lab.train.profile import ProfileWindow, with_profiler
from raytpu_lab.train.protocols import TorchRunSummary, Trainer
from raytpu_lab.train.result import RunResult
from raytpu_lab.train.run import RunHandle
from raytpu_lab.train.spec import RunSpec, validate
from raytpu_lab.train.torch_checks import check_backend
from raytpu_lab.train.xla_profile import CompileTrend, recompilation_storm, xla_metrics_by_rank

__all__ = ["TorchRunResult", "is_emulated", "resolve_backend", "start_torch"]


@dataclass(repr=False)
class TorchRunResult(RunResult):
    """A :class:`RunResult` of a device-centric run, plus where each rank ran and its XLA metrics.

    Attributes:
        backend: The process-group backend that ran (``"gloo"`` on the emulator).
        pjrt_device: ``"TPU"`` or ``"CPU"`` (the emulator).
        chips_per_worker: TPU chips per worker (1: one worker per chip).
    """

    backend: str = "xla"
    pjrt_device: str = "TPU"
    chips_per_worker: int = 1
    requested_backend: str | None = field(default=None)
    trainer: Trainer = field(default="torch", init=False)

    @property
    def num_workers(self) -> int:
        """Ray Train workers: one per ``chips_per_worker`` chips of every slice."""
        return self.shape.num_chips * self.num_slices // self.chips_per_worker

    @property
    def chip_placement(self) -> dict[int, dict[str, Any]]:
        """``{rank: {"slice", "host", "chip", "node_id"}}``: the slice, the host's TPU worker id,
        the chip Ray assigned (``get_accelerator_ids()["TPU"]``; a comma-separated string when a
        worker holds several) and the Ray node, from the worker tap's placement rows."""
        out: dict[int, dict[str, Any]] = {}
        for w in self.workers:  # a restarted worker group's later row wins
            chips = [str(c) for c in w.get("chips") or []]
            out[int(w["rank"])] = {"slice": w.get("slice") or "", "host": w.get("worker_id"),
                                   "chip": int(chips[0]) if len(chips) == 1 else ",".join(chips),
                                   "node_id": w.get("node_id")}
        return dict(sorted(out.items()))

    @property
    def xla_metrics(self) -> dict[int, dict[str, Any]]:
        """``{rank: torch_xla metrics}`` each worker sent when its function ended."""
        return xla_metrics_by_rank(self.worker_summaries)

    def compile_trends(self, warmup_steps: int = 3) -> dict[int, CompileTrend]:
        """``{rank: compile trend}``; a trend's ``storm`` flags recompilation after warm-up."""
        return {rank: recompilation_storm(m.get("xla_compiles_per_step", []),
                                          warmup_steps=warmup_steps)
                for rank, m in self.xla_metrics.items()}

    def summary(self) -> TorchRunSummary:
        """:meth:`RunResult.summary` plus backend, PJRT device and the XLA compile picture."""
        trends = self.compile_trends()
        rank0 = self.xla_metrics.get(0, {})
        return {**super().summary(), "backend": self.backend, "pjrt_device": self.pjrt_device,
                "xla_compiles": rank0.get("xla_compile_count"),
                "xla_compile_time_s": rank0.get("xla_compile_time_s"),
                "recompilation_storm": sorted(r for r, t in trends.items() if t.storm)}


def is_emulated(snapshot: ClusterSnapshot, shape: SliceShape) -> bool:
    """Whether the slices of ``shape`` are emulated (their hosts carry the emulator's label)."""
    return any(host.labels.get(EMULATED_LABEL) == "true"
               for s in snapshot.slices_of(shape.pod_type) for host in s.hosts)


def resolve_backend(requested: str | None, emulated: bool) -> tuple[str, str]:
    """``(process-group backend, PJRT_DEVICE)`` for a run; see the table in the module docstring."""
    check_backend(requested)
    if emulated:
        return "gloo", "CPU"
    return requested or "xla", "TPU"


def start_torch(
    train_fn: Callable[..., Any],
    shape: SliceShape,
    *,
    name: str,
    num_slices: int = 1,
    config: dict[str, Any] | None = None,
    backend: str | None = None,
    chips_per_worker: int = 1,
    emulated: bool = False,
    storage_path: str | None = None,
    profile: ProfileWindow | None = None,
    max_failures: int = 0,
    **kwargs: Any,
) -> RunHandle:
    """Start ``train_fn`` with ``TorchTrainer`` on every chip of ``num_slices`` slices; returns
    the run's handle at once (its ``result`` is a :class:`TorchRunResult`).

    Args:
        train_fn: The per-worker function, ``train_fn(config)`` or ``train_fn()``; it gets its
            device from :func:`raytpu_lab.train.torch_xla_utils.device` and calls
            ``ray.train.report(metrics)`` (every rank equally often).
        shape: Generation and topology of each slice.
        name: Run name.
        num_slices: Slices to train on.
        config: ``train_loop_config``.
        backend: ``"xla"`` (default on TPUs), ``"tpu_dist"`` or ``"gloo"``; the emulator always
            runs ``gloo`` (see :func:`resolve_backend`).
        chips_per_worker: TPU chips each worker requests (``resources_per_worker={"TPU": n}``).
        emulated: The slices are emulated (:func:`is_emulated`): PJRT on CPU, gloo.
        storage_path: Ray Train's storage; Ray's default if ``None``.
        profile: Steps to trace with ``torch_xla``'s profiler on every worker (see
            :mod:`raytpu_lab.train.profile` for what such a trace holds); traces go to
            ``<run storage>/profile/``.
        max_failures: Ray Train's ``FailureConfig(max_failures=...)`` (restarts after a
            worker group failure; -1: no limit).
        kwargs: ``snapshot``, ``on_placement``, ``on_finish``, ``listeners``,
            ``mute_driver_logs``... as for :func:`~raytpu_lab.train.launch.start_run`.

    Raises:
        TrainingConfigError: A check of :func:`~raytpu_lab.train.spec.validate` failed (nothing
            was launched).
    """
    num_workers = validate(RunSpec("torch", shape.topology, shape.version, train_fn,
                                   slices=num_slices, backend=backend,
                                   chips_per_worker=chips_per_worker)).num_workers
    if profile is not None:
        train_fn = with_profiler(train_fn, profile, "torch_xla")
    pg_backend, pjrt_device = resolve_backend(backend, emulated)
    # Ray Train's v2 classes load here, after the checks: they import torch.
    from ray.train.v2.api.config import FailureConfig, RunConfig, ScalingConfig
    from ray.train.v2.torch.torch_trainer import TorchTrainer

    from raytpu_lab.train.launch import start_run, user_flops
    from raytpu_lab.train.torch_backend import TorchXlaConfig
    from raytpu_lab.train.torch_xla_utils import xla_metrics

    def make_trainer(callbacks: list[Any], wrapped: Callable[..., Any]) -> Any:
        return TorchTrainer(
            wrapped, train_loop_config=config,
            torch_config=TorchXlaConfig(backend=pg_backend, pjrt_device=pjrt_device),
            scaling_config=ScalingConfig(
                use_tpu=True, topology=shape.topology, accelerator_type=shape.accelerator_type,
                num_workers=num_workers, resources_per_worker={"TPU": chips_per_worker}),
            run_config=RunConfig(name=name, storage_path=storage_path, callbacks=callbacks,
                                 failure_config=FailureConfig(max_failures=max_failures)))

    result = TorchRunResult(name=name, shape=shape, num_slices=num_slices, backend=pg_backend,
                            pjrt_device=pjrt_device, chips_per_worker=chips_per_worker,
                            requested_backend=backend)
    result.flops_per_step = user_flops(config)
    return start_run(make_trainer, shape, name=name, num_slices=num_slices, train_fn=train_fn,
                     result=result, worker_summary=xla_metrics, max_failures=max_failures,
                     **kwargs)

