"""Launching Ray Train runs on TPU slices and streaming what workers report.

The runs are plain Ray Train: ``JaxTrainer`` (one worker per host) or ``TorchTrainer`` (one worker per
chip), each with ``ScalingConfig(use_tpu=True, topology=..., accelerator_type=...)``; Ray reserves the
slices with its ``SlicePlacementGroup`` (and, for JAX, initialises ``jax.distributed``). We only add
callbacks to the run's ``RunConfig``: a :class:`ray.train.UserCallback` that forwards every
``ray.train.report`` (all ranks) to a small queue actor, and one that hands out Ray Train's
controller so the run can be stopped from any thread; and, when given the training function, we
wrap it (:mod:`raytpu_lab.train.worker_tap`) so each worker reports where it runs, its log lines
and its traceback. ``fit()`` runs in a background thread (:class:`~raytpu_lab.train.run.RunHandle`).

Ray Train's controller takes one report per worker every ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``
(2 s by default) and ``ray.train.report`` blocks until then; for a live chart we set it to
``REPORT_INTERVAL_S`` when the user has not set it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray.train import TrainingFailedError, UserCallback

# The V2 config classes JaxTrainer takes (``ray.train.RunConfig`` resolves to them at run time).
from ray.train.v2.api.config import FailureConfig, RunConfig, ScalingConfig
from ray.train.v2.jax import JaxTrainer
from ray.util.queue import Queue
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raytpu_lab import _ray_private
from raytpu_lab.state.fetch import fetch_placement_group_states
from raytpu_lab.state.snapshot import ClusterSnapshot
from raytpu_lab.tpu.topology import SliceShape
from raytpu_lab.train.profile import ProfileWindow, with_profiler
from raytpu_lab.train.result import RunResult
from raytpu_lab.train.run import RunHandle, RunListener, RunUpdate
from raytpu_lab.train.worker_tap import accepts_config, tap_train_fn

__all__ = ["RunHandle", "RunListener", "RunResult", "RunUpdate", "TrainerFactory", "start_jax",
           "start_run", "user_flops", "REPORT_INTERVAL_S"]

REPORT_INTERVAL_S = 0.5
_HEALTH_CHECK_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"

#: Builds the Ray Train trainer for a run from the callbacks it must carry in its ``RunConfig``
#: (``make_trainer(callbacks)``), or, when :func:`start_run` gets ``train_fn``, from the callbacks
#: and the wrapped training function to hand to the trainer (``make_trainer(callbacks, train_fn)``).
TrainerFactory = Callable[..., Any]


class _StreamReports(UserCallback):
    """Runs in Ray Train's controller: forwards each round of reports to the queue actor."""

    def __init__(self, queue: Queue) -> None:
        self._queue = queue
        self._start = time.time()
        self._index = 0

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        now = time.time() - self._start
        rows = [{"report": self._index, "rank": rank, "time_s": now, **m} for rank, m in enumerate(metrics)]
        self._index += 1
        try:
            # Not Queue.put_nowait, which waits for the queue actor: this runs in the controller's
            # loop, and while it waits no worker's next ray.train.report can be taken in. One
            # caller's calls to the queue actor run in order; a full queue drops the rows.
            self._queue.actor.put_nowait.remote({"kind": "reports", "rows": rows})  # type: ignore[union-attr]
        except Exception:  # a gone queue must never fail the training run
            pass


class _Announce:
    """Picklable ``send`` for the controller announcer: puts the handle on the events queue."""

    def __init__(self, queue: Queue) -> None:
        self._queue = queue

    def __call__(self, handle: Any) -> None:
        # Runs in the controller actor: its pid is the one Ray's log batches carry for it.
        self._queue.put_nowait({"kind": "controller", "handle": handle, "pid": os.getpid()})


class _Send:
    """Picklable ``send`` for callbacks in the controller: puts one event on the events queue."""

    def __init__(self, queue: Queue) -> None:
        self._queue = queue

    def __call__(self, event: dict[str, Any]) -> None:
        try:  # as _StreamReports: never wait for the queue actor in the controller's loop
            self._queue.actor.put_nowait.remote(event)  # type: ignore[union-attr]
        except Exception:  # a gone queue must never fail the training run
            pass


def start_jax(
    train_fn: Callable[..., Any],
    shape: SliceShape,
    *,
    name: str,
    num_slices: int = 1,
    config: dict[str, Any] | None = None,
    storage_path: str | None = None,
    profile: ProfileWindow | None = None,
    max_failures: int = 0,
    **kwargs: Any,
) -> RunHandle:
    """Start ``train_fn`` under ``JaxTrainer`` on ``num_slices`` slices of ``shape``; return at once.

    ``JaxTrainer(ScalingConfig(use_tpu=True, topology, accelerator_type, num_workers=hosts x
    slices))``: one worker per TPU host. See :func:`start_run` for the other arguments and the
    errors.

    Args:
        train_fn: The per-worker training function, ``train_fn(config)`` or ``train_fn()``; it
            calls ``ray.train.report(metrics)`` to report (every rank must call it equally often).
        config: Passed to ``train_fn`` as ``train_loop_config``.
        storage_path: Ray Train's storage (local dir or ``gs://``); Ray's default if ``None``.
        profile: Steps to trace with ``jax.profiler`` on every worker
            (:func:`raytpu_lab.train.profile.with_profiler`); traces go to
            ``<run storage>/profile/``.
        max_failures: Ray Train's ``FailureConfig(max_failures=...)``: restarts after a worker
            group failure (-1: no limit). Ray's JAX backend gives every new worker group fresh
            ``MEGASCALE_*`` values (``ray/train/v2/jax/config.py``, which overwrites them).
    """
    if profile is not None:
        train_fn = with_profiler(train_fn, profile, "jax")

    def make_trainer(callbacks: list[Any], wrapped: Callable[..., Any]) -> JaxTrainer:
        return JaxTrainer(
            wrapped,
            train_loop_config=config,
            scaling_config=ScalingConfig(
                use_tpu=True, topology=shape.topology, accelerator_type=shape.accelerator_type,
                num_workers=shape.num_hosts * num_slices),
            run_config=RunConfig(name=name, storage_path=storage_path, callbacks=callbacks,
                                 failure_config=FailureConfig(max_failures=max_failures)),
        )

    if kwargs.get("result") is None:
        kwargs["result"] = RunResult(name=name, shape=shape, num_slices=num_slices)
    kwargs["result"].flops_per_step = user_flops(config)
    return start_run(make_trainer, shape, name=name, num_slices=num_slices, train_fn=train_fn,
                     max_failures=max_failures, **kwargs)


def user_flops(config: Any) -> float | None:
    """The ``flops_per_step`` key of a run's config (model FLOPs of one step, all chips), or
    ``None`` (see :mod:`raytpu_lab.train.mfu`)."""
    value = config.get("flops_per_step") if isinstance(config, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def start_run(
    make_trainer: TrainerFactory,
    shape: SliceShape,
    *,
    name: str,
    num_slices: int = 1,
    train_fn: Callable[..., Any] | None = None,
    snapshot: Callable[[], ClusterSnapshot] | None = None,
    on_placement: Callable[[list[str], list[str]], None] | None = None,
    on_finish: Callable[[RunHandle], None] | None = None,
    listeners: Sequence[RunListener] = (),
    poll_interval_s: float = 0.25,
    mute_driver_logs: bool = False,
    log_flush_interval_s: float = 0.25,
    result: RunResult | None = None,
    worker_summary: Callable[[], dict[str, Any]] | None = None,
    max_failures: int = 0,
) -> RunHandle:
    """Build a Ray Train trainer with our callbacks, start ``fit()`` in a thread, return its handle.

    Trainer-agnostic: everything trainer-specific is in ``make_trainer``.

    Args:
        make_trainer: Returns the trainer (``JaxTrainer``, ``TorchTrainer``...) given the callbacks
            to put in its ``RunConfig(callbacks=...)`` and, if ``train_fn`` is given, the wrapped
            training function to pass instead of it: ``make_trainer(callbacks, wrapped)``; else
            ``make_trainer(callbacks)``. Its run must be named ``name``.
        shape: Generation and topology of each slice.
        name: Run name.
        num_slices: Slices to train on (multi-slice when > 1).
        train_fn: The user's per-worker function; its signature is checked here, before anything
            is launched, and it is wrapped to report placement, logs and errors per rank.
        snapshot: Returns a cluster snapshot; used to find the slices the run landed on.
        on_placement: Called once from the drain thread with the slices the run landed on and the
            ids of the placement groups holding them.
        on_finish: Called once from the drain thread when the run ended, before the listeners
            hear of it (see :class:`RunHandle`).
        listeners: Get every update (records, placement, logs, errors, with the result they were
            folded into) and the end of the run.
        poll_interval_s: How often the drain thread empties the queues, seconds (listeners are
            called at most this often).
        mute_driver_logs: Keep Ray from also printing this run's worker and controller logs in
            the driver, until 10 s after it ends (a dashboard shows them instead; Ray's log files
            keep them).
        log_flush_interval_s: How often each worker ships its new log lines, seconds.
        result: The (empty) result object to fill, e.g. a subclass with trainer-specific views;
            a plain :class:`RunResult` if ``None``.
        worker_summary: With ``train_fn``: called in each worker when it ends; the dicts land
            in ``result.worker_summaries`` (see :func:`~raytpu_lab.train.worker_tap.tap_train_fn`).
        max_failures: The run's restart budget (as its ``FailureConfig``): with one, a rank
            that raises is left to Ray Train to restart instead of ending the run at once, and
            each restart Ray Train's controller makes is reported (``result.attempts``).

    Returns:
        The running run's handle (:meth:`RunHandle.wait`, :meth:`RunHandle.stop`).

    Raises:
        TrainingConfigError: ``train_fn`` has a signature Ray Train cannot call (nothing started).
    """
    if train_fn is not None:
        accepts_config(train_fn)  # before any actor or placement group exists
    os.environ.setdefault(_HEALTH_CHECK_ENV, str(REPORT_INTERVAL_S))
    events, logs = _queue_on_this_node(), _queue_on_this_node()
    if result is None:
        result = RunResult(name=name, shape=shape, num_slices=num_slices)
    known_pgs = _placement_group_ids()
    callbacks = [_StreamReports(events), _ray_private.controller_announcer(_Announce(events)),
                 _ray_private.restart_reporter(_Send(events))]
    try:
        if train_fn is not None:
            wrapped = tap_train_fn(train_fn, events, logs, flush_interval_s=log_flush_interval_s,
                                   worker_summary=worker_summary)
            trainer = make_trainer(callbacks, wrapped)
        else:
            trainer = make_trainer(callbacks)
    except BaseException:
        for q in (events, logs):
            _shutdown_queue(q)
        raise

    find_slices = (lambda known: _new_slices(snapshot(), known)) if snapshot is not None else None
    handle = RunHandle(name, result, trainer.fit, events, logs, listeners=listeners,
                       on_slices=on_placement, on_finish=on_finish, find_slices=find_slices,
                       poll_interval_s=poll_interval_s, mute_driver_logs=mute_driver_logs,
                       error_text=_error_text, known_pgs=known_pgs,
                       fail_fast=max_failures == 0)
    return handle.start()


def _placement_group_ids() -> set[str]:
    return set(fetch_placement_group_states())


def _new_slices(snap: ClusterSnapshot, known_pgs: set[str]) -> tuple[list[str], list[str]]:
    """Slices held by placement groups that appeared after launch (the run's), and those groups."""
    new = {f"placement group {pg[:8]}": pg for pg in _placement_group_ids() - known_pgs}
    slices = [s for s in snap.slices if set(new) & set(s.owners)]
    pg_ids = sorted({new[o] for s in slices for o in s.owners if o in new})
    return [s.name for s in slices], pg_ids


def _error_text(err: BaseException) -> str:
    if isinstance(err, TrainingFailedError):
        return _worker_error_text(err)
    return f"{type(err).__name__}: {err}"


def _worker_error_text(err: TrainingFailedError) -> str:
    failures = getattr(err, "worker_failures", None) or {}
    if failures:
        rank, exc = sorted(failures.items())[0]
        more = f" (and {len(failures) - 1} more rank(s))" if len(failures) > 1 else ""
        # Ray hands back the user's exception; its remote traceback, when Ray kept one, is the cause.
        detail = f"{type(exc).__name__}: {exc}"
        cause = exc.__cause__
        if cause is not None and str(cause) not in detail:
            detail = f"{cause}\n{detail}"
        return f"rank {rank}{more}: {detail}"
    return str(err)


def _queue_on_this_node() -> Queue:
    """A run's stream queue (an actor, no CPU), pinned to the driver's node.

    Left to Ray, a zero-CPU actor may land on a TPU host; when that host is lost (what a restart
    budget is for) the run's reports, restart events and logs would be lost with it, and the run
    would go on unseen. The pin is hard: a soft ``NodeAffinitySchedulingStrategy`` to the
    driver's node was seen to place two queues of three on TPU hosts of an idle emulated
    cluster (Ray 2.60), and a lost host then took the run's stream with it. The driver's node
    always takes a zero-CPU actor (a GKE head with ``num-cpus: 0`` too). Ray Train attaches its
    own controller to the driver's node the same way (a ``label_selector`` on the node id; Ray
    2.60, ``ray/train/v2/api/data_parallel_trainer.py``).
    """
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return Queue(maxsize=10_000, actor_options={"num_cpus": 0, "scheduling_strategy": here})


def _shutdown_queue(queue: Queue) -> None:
    try:
        queue.shutdown(force=True)
    except Exception:  # the cluster may be gone already; the actor dies with it
        pass
