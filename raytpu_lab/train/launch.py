"""Launching Ray Train runs on TPU slices and streaming what workers report.

The runs are plain Ray Train: ``JaxTrainer`` (one worker per host) or ``TorchTrainer`` (one worker per
chip), each with ``ScalingConfig(use_tpu=True, topology=..., accelerator_type=...)``; Ray reserves the
slices with its ``SlicePlacementGroup`` (and, for JAX, initialises ``jax.distributed``). We only add a :class:`ray.train.UserCallback` that forwards every
``ray.train.report`` (all ranks) to a small queue actor, which a background thread in the notebook
drains for the live chart, and we find which slices the run landed on from the cluster snapshot.

Ray Train's controller takes one report per worker every ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``
(2 s by default) and ``ray.train.report`` blocks until then; for a live chart we set it to
``REPORT_INTERVAL_S`` when the user has not set it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import ray
from ray.train import TrainingFailedError, UserCallback

# The V2 config classes JaxTrainer takes (``ray.train.RunConfig`` resolves to them at run time).
from ray.train.v2.api.config import RunConfig, ScalingConfig
from ray.train.v2.jax import JaxTrainer
from ray.util.queue import Empty, Queue

from raytpu_lab.errors import TrainingError
from raytpu_lab.state.model import ClusterSnapshot
from raytpu_lab.tpu.topology import SliceShape
from raytpu_lab.train.profile import ProfileWindow, with_profiler
from raytpu_lab.train.result import RunResult

__all__ = ["RunResult", "TrainerFactory", "launch_jax", "launch_run", "REPORT_INTERVAL_S"]

REPORT_INTERVAL_S = 0.5
_HEALTH_CHECK_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"

#: Builds the Ray Train trainer for a run from the callbacks it must carry in its ``RunConfig``.
TrainerFactory = Callable[[list[UserCallback]], Any]


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
            self._queue.put_nowait(rows)
        except Exception:  # a full or gone queue must never fail the training run
            pass


def launch_jax(
    train_fn: Callable[..., Any],
    shape: SliceShape,
    *,
    name: str,
    num_slices: int = 1,
    config: dict[str, Any] | None = None,
    storage_path: str | None = None,
    snapshot: Callable[[], ClusterSnapshot] | None = None,
    on_records: Callable[[list[dict[str, Any]]], None] | None = None,
    on_placement: Callable[[list[str], list[str]], None] | None = None,
    poll_interval_s: float = 0.5,
    profile: ProfileWindow | None = None,
) -> RunResult:
    """Run ``train_fn`` with ``JaxTrainer`` on ``num_slices`` slices of ``shape``; block until done.

    ``JaxTrainer(ScalingConfig(use_tpu=True, topology, accelerator_type, num_workers=hosts x
    slices))``: one worker per TPU host. See :func:`launch_run` for the other arguments, the
    result and the errors.

    Args:
        train_fn: The per-worker training function, ``train_fn(config)`` or ``train_fn()``; it
            calls ``ray.train.report(metrics)`` to report (every rank must call it equally often).
        config: Passed to ``train_fn`` as ``train_loop_config``.
        storage_path: Ray Train's storage (local dir or ``gs://``); Ray's default if ``None``.
        profile: Steps to trace with ``jax.profiler`` on every worker
            (:func:`raytpu_lab.train.profile.with_profiler`); traces go to
            ``<run storage>/profile/``.
    """
    if profile is not None:
        train_fn = with_profiler(train_fn, profile)

    def make_trainer(callbacks: list[UserCallback]) -> JaxTrainer:
        return JaxTrainer(
            train_fn,
            train_loop_config=config,
            scaling_config=ScalingConfig(
                use_tpu=True, topology=shape.topology, accelerator_type=shape.accelerator_type,
                num_workers=shape.num_hosts * num_slices),
            run_config=RunConfig(name=name, storage_path=storage_path,
                                 callbacks=callbacks),  # type: ignore[arg-type]
        )

    return launch_run(make_trainer, shape, name=name, num_slices=num_slices, snapshot=snapshot,
                      on_records=on_records, on_placement=on_placement,
                      poll_interval_s=poll_interval_s)


def launch_run(
    make_trainer: TrainerFactory,
    shape: SliceShape,
    *,
    name: str,
    num_slices: int = 1,
    snapshot: Callable[[], ClusterSnapshot] | None = None,
    on_records: Callable[[list[dict[str, Any]]], None] | None = None,
    on_placement: Callable[[list[str], list[str]], None] | None = None,
    poll_interval_s: float = 0.5,
) -> RunResult:
    """Build a Ray Train trainer with our report-streaming callback, ``fit()`` it, collect the result.

    Args:
        make_trainer: Returns the trainer (``JaxTrainer``, ``TorchTrainer``...) given the callbacks
            to put in its ``RunConfig(callbacks=...)``; its run must be named ``name``.
        shape: Generation and topology of each slice.
        name: Run name.
        num_slices: Slices to train on (multi-slice when > 1).
        snapshot: Returns a cluster snapshot; used to find the slices the run landed on.
        on_records: Called from a background thread with each batch of new records, at most
            every ``poll_interval_s`` seconds (for a live chart).
        on_placement: Called once from the background thread with the slices the run landed on
            and the ids of the placement groups holding them.
        poll_interval_s: How often the background thread drains reports, seconds.

    Returns:
        The run's records and summary.

    Raises:
        TrainingError: The workers raised; carries the first worker's traceback text. Ray Train
            has already torn down the workers and freed the slices.
        KeyboardInterrupt: Interrupted; Ray Train's own SIGINT handler aborted the run first.
    """
    os.environ.setdefault(_HEALTH_CHECK_ENV, str(REPORT_INTERVAL_S))
    queue = Queue(maxsize=10_000, actor_options={"num_cpus": 0})
    result = RunResult(name=name, shape=shape, num_slices=num_slices)
    known_pgs = _placement_group_ids()
    trainer = make_trainer([_StreamReports(queue)])
    stop = threading.Event()

    def drain() -> None:
        while True:
            batch: list[dict[str, Any]] = []
            try:
                for rows in queue.get_nowait_batch(queue.qsize()):
                    batch.extend(rows)
            except (Empty, ray.exceptions.RayError):
                pass
            if batch:
                result.records.extend(batch)
                if on_records is not None:
                    on_records(batch)
            if snapshot is not None and not result.slice_names:
                result.slice_names, pg_ids = _new_slices(snapshot(), known_pgs)
                if result.slice_names and on_placement is not None:
                    on_placement(result.slice_names, pg_ids)
            if stop.is_set():
                return
            stop.wait(poll_interval_s)

    poller = threading.Thread(target=drain, name=f"raytpu-{name}", daemon=True)
    start = time.monotonic()
    previous_sigint = signal.getsignal(signal.SIGINT)
    poller.start()
    try:
        ray_result = trainer.fit()
        result.ray_result = ray_result
        result.storage_path = getattr(ray_result, "path", "") or ""
        error = getattr(ray_result, "error", None)
        if isinstance(error, TrainingFailedError):
            result.error = _worker_error_text(error)
    except TrainingFailedError as err:
        # Keep only the text: the exception's traceback reaches Ray Train's controller handle,
        # and a kept handle (e.g. through IPython's sys.last_traceback) keeps the controller
        # and its helper actors alive after the run.
        result.error = _worker_error_text(err)
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, previous_sigint)  # Ray Train's fit() installs its own
        result.wall_s = time.monotonic() - start
        stop.set()
        poller.join(timeout=10)
        _shutdown_queue(queue)
    if result.error is not None:
        raise TrainingError(
            f"Training run {name!r} failed on its workers.",
            why=result.error, fix="Fix the training function and run the cell again; "
            "the slices were freed.", run_name=name, worker_error=result.error)
    return result


def _placement_group_ids() -> set[str]:
    return set(ray.util.placement_group_table())


def _new_slices(snap: ClusterSnapshot, known_pgs: set[str]) -> tuple[list[str], list[str]]:
    """Slices held by placement groups that appeared after launch (the run's), and those groups."""
    new = {f"placement group {pg[:8]}": pg for pg in _placement_group_ids() - known_pgs}
    slices = [s for s in snap.slices if set(new) & set(s.owners)]
    pg_ids = sorted({new[o] for s in slices for o in s.owners if o in new})
    return [s.name for s in slices], pg_ids


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


def _shutdown_queue(queue: Queue) -> None:
    try:
        queue.shutdown(force=True)
    except Exception:  # the cluster may be gone already; the actor dies with it
        pass
