"""What a training run asks for, and every check of it that needs no cluster. Pure: no Ray.

A :class:`RunSpec` names the trainer (``"jax"``: ``JaxTrainer``, one worker per host;
``"torch"``: ``TorchTrainer``, one worker per chip), the slices, the function and its config, the
reservation to run on and the steps to profile. :func:`validate` makes every check that needs no
cluster, in the order a user fixes them (shape, slice count, profile window, config, function),
and returns a :class:`CheckedRun`; :class:`raytpu_lab.train.service.Runs` starts only checked runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args

from raytpu_lab._checks import require_positive
from raytpu_lab.advice import opt
from raytpu_lab.errors import RaytpuError, TrainingConfigError
from raytpu_lab.tpu.topology import SliceShape
from raytpu_lab.train.profile import ProfileWindow, parse_profile_window
from raytpu_lab.train.torch_checks import (
    check_backend,
    check_torch_versions,
    installed_versions,
    workers_per_run,
)
from raytpu_lab.train.worker_tap import accepts_config, check_names

__all__ = ["CheckedRun", "ProfileArg", "RunSpec", "TRAINER_KINDS", "TrainerKind",
           "check_max_failures", "max_failures_of", "validate"]

TrainerKind = Literal["jax", "torch"]
TRAINER_KINDS: tuple[TrainerKind, ...] = get_args(TrainerKind)
ProfileArg = str | tuple[int, int] | ProfileWindow
"""A profile window as users write it: ``"START:STOP"``, ``(start, stop)`` or a window."""


@dataclass(frozen=True)
class RunSpec:
    """One training run as asked, before any check.

    Attributes:
        trainer: ``"jax"`` or ``"torch"``.
        topology: Slice topology, e.g. ``"4x4"``.
        version: Accelerator version, e.g. ``"v6e"``.
        train_fn: The per-worker function ``f(config)`` or ``f()``; ``None`` to check
            everything else (a cell magic checks the shape before it runs the cell).
        slices: Slices to train on (multi-slice when > 1).
        name: Run name; ``<trainer>-<HHMMSS>`` when ``None``.
        config: ``train_loop_config`` (a dict or ``None``).
        reservation: Run on exactly this reservation's slices.
        profile: Steps to trace on every worker (see :mod:`raytpu_lab.train.profile`).
        storage_path: Ray Train storage for checkpoints, results and traces.
        wait_s: Seconds to wait for idle slices (or, with ``reservation``, for the run to land).
        backend: Torch only: process-group backend (``"xla"``, ``"tpu_dist"``, ``"gloo"``).
        chips_per_worker: Torch only: TPU chips per worker.
        max_failures: Restarts Ray Train may make after a worker group fails (a rank raised,
            a host died): Ray Train's ``FailureConfig(max_failures=...)``; 0 (the default): none,
            -1: without limit. Each restart starts a new worker group on slices Ray picks
            again (see :class:`~raytpu_lab.train.result.Attempt`).
    """

    trainer: TrainerKind
    topology: str
    version: str
    train_fn: Callable[..., Any] | None = None
    slices: int = 1
    name: str | None = None
    config: Any = None
    reservation: str | None = None
    profile: ProfileArg | None = None
    storage_path: str | None = None
    wait_s: float = 60.0
    backend: str | None = None
    chips_per_worker: int = 1
    max_failures: int = 0


@dataclass(frozen=True)
class CheckedRun:
    """A :class:`RunSpec` that passed :func:`validate`, with what the checks derived.

    Attributes:
        spec: The run as asked.
        shape: The slice shape.
        window: The profile window, or ``None``.
        num_workers: Ray Train workers (hosts x slices for JAX, chips x slices / chips per
            worker for torch).
    """

    spec: RunSpec
    shape: SliceShape
    window: ProfileWindow | None
    num_workers: int

    @property
    def config(self) -> dict[str, Any] | None:
        """The validated ``train_loop_config``."""
        config: dict[str, Any] | None = self.spec.config
        return config

    def run_name(self) -> str:
        """The spec's name, else ``<trainer>-<HHMMSS>`` (now)."""
        return self.spec.name or f"{self.spec.trainer}-{time.strftime('%H%M%S')}"


def validate(spec: RunSpec) -> CheckedRun:
    """Every check of ``spec`` that needs no cluster; contacts nothing and starts nothing.

    Returns:
        The checked run.

    Raises:
        InvalidTopologyError: Bad generation or topology (``.nearest``: valid ones nearby).
        RaytpuError: ``slices`` is not a finite number above 0, or ``trainer`` is none of
            :data:`TRAINER_KINDS`.
        TrainingConfigError: ``max_failures`` is not a whole number of -1 or more.
        TrainingConfigError: A bad profile window or config; for torch, torch/torch_xla missing
            or mismatched, a bad backend or chips per worker not dividing a host's chips; a
            function Ray Train cannot call, or one that reads a name defined nowhere (see
            :func:`~raytpu_lab.train.worker_tap.check_names`).
    """
    if spec.trainer not in TRAINER_KINDS:
        raise RaytpuError(f"No trainer {spec.trainer!r}.",
                          fix=f"Use one of {', '.join(TRAINER_KINDS)}.")
    shape = SliceShape.of(spec.version, spec.topology)
    require_positive("slices", spec.slices)
    check_max_failures(spec.max_failures)
    window = parse_profile_window(spec.profile) if spec.profile is not None else None
    _require_config_dict(spec.config)
    if spec.trainer == "torch":
        check_torch_versions(*installed_versions())
        check_backend(spec.backend)
        num_workers = workers_per_run(shape, spec.slices, spec.chips_per_worker)
    else:
        num_workers = shape.num_hosts * spec.slices
    if spec.train_fn is not None:
        accepts_config(spec.train_fn)
        check_names(spec.train_fn)
    return CheckedRun(spec, shape, window, num_workers)


def check_max_failures(value: Any) -> int:
    """``value`` as Ray Train's ``FailureConfig.max_failures``: a whole number, -1 (no limit) or
    more; returns it.

    Raises:
        TrainingConfigError: Anything else (a bool, a float, a string, below -1).
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise TrainingConfigError(
            f"max failures is {value!r}, not a whole number of -1 or more.",
            why="Ray Train restarts a failed run at most that many times (-1: without limit, "
                "0: never).",
            fix=("Pass e.g. ", opt("max_failures", 1), "."))
    return value


def max_failures_of(max_failures: int = 0, failure_config: Any = None) -> int:
    """The restart budget of a run asked as ``max_failures=`` or ``failure_config=`` (Ray Train's
    ``FailureConfig``, read by its ``max_failures`` attribute; no Ray import here).

    Raises:
        TrainingConfigError: Both given with different budgets, a ``failure_config`` without
            ``max_failures``, or a bad budget (:func:`check_max_failures`).
    """
    if failure_config is None:
        return check_max_failures(max_failures)
    budget = getattr(failure_config, "max_failures", None)
    if budget is None:
        raise TrainingConfigError(
            f"failure_config is a {type(failure_config).__name__}, which has no max_failures.",
            why="Runs take their restart budget from Ray Train's FailureConfig.",
            fix="Pass ray.train.FailureConfig(max_failures=N), or max_failures=N alone.")
    if max_failures not in (0, budget):
        raise TrainingConfigError(
            f"max_failures={max_failures!r} and failure_config.max_failures={budget!r} differ.",
            why="A run has one restart budget.", fix="Give one of them.")
    return check_max_failures(budget)


def _require_config_dict(config: Any) -> None:
    if config is not None and not isinstance(config, dict):
        raise TrainingConfigError(
            f"The training config is a {type(config).__name__}, not a dict.",
            why="Ray Train passes train_loop_config to the function as a dict.",
            fix=("Pass a dict, e.g. ", opt("config", {"steps": 100}), "."))

