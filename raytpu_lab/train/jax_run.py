"""Launching Ray Train's ``JaxTrainer`` on TPU slices and streaming what workers report.

The run is plain Ray Train: ``JaxTrainer(ScalingConfig(use_tpu=True, topology=..., accelerator_type=...,
num_workers=hosts x slices))``; Ray reserves the slices with its ``SlicePlacementGroup`` and
initialises ``jax.distributed``. We only add a :class:`ray.train.UserCallback` that forwards every
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
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.train import RunConfig, ScalingConfig, TrainingFailedError, UserCallback
from ray.train.v2.jax import JaxTrainer
from ray.util.queue import Empty, Queue

from raytpu_lab.errors import TrainingError
from raytpu_lab.state.model import ClusterSnapshot
from raytpu_lab.tpu.topology import SliceShape

__all__ = ["RunResult", "launch_jax", "REPORT_INTERVAL_S"]

REPORT_INTERVAL_S = 0.5
_HEALTH_CHECK_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"


@dataclass
class RunResult:
    """What a training run did: every report of every rank, timing, placement and Ray's result.

    Attributes:
        name: Run name (Ray Train's ``RunConfig.name``).
        shape: Generation and topology of each slice.
        num_slices: Slices the run used.
        records: One dict per report and rank: ``{"report": i, "rank": r, "time_s": t, **metrics}``
            where ``time_s`` is seconds since launch when the controller received it.
        wall_s: Seconds from launch to the end of ``fit()``.
        slice_names: Slices the run's placement group landed on.
        storage_path: Where Ray Train kept the run's checkpoints and results.
        error: The workers' error text if the run failed, else ``None``.
        ray_result: Ray Train's ``Result`` (``None`` if the run failed).
    """

    name: str
    shape: SliceShape
    num_slices: int
    records: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0
    slice_names: list[str] = field(default_factory=list)
    storage_path: str = ""
    error: str | None = None
    ray_result: Any = None

    @property
    def num_workers(self) -> int:
        """Ray Train workers: one per host (host-centric JAX)."""
        return self.shape.num_hosts * self.num_slices

    def rank0(self) -> list[dict[str, Any]]:
        """Records of rank 0, in report order."""
        return [r for r in self.records if r["rank"] == 0]

    @property
    def steps(self) -> int:
        """Training steps seen: the last reported ``step`` + 1, or the number of reports."""
        rows = self.rank0()
        if rows and "step" in rows[-1]:
            return int(rows[-1]["step"]) + 1
        return len(rows)

    @property
    def steps_per_s(self) -> float:
        """Steps per second between the first and the last report of rank 0 (compile excluded)."""
        rows = [r for r in self.rank0() if "step" in r]
        if len(rows) < 2 or rows[-1]["time_s"] <= rows[0]["time_s"]:
            return 0.0
        return (rows[-1]["step"] - rows[0]["step"]) / (rows[-1]["time_s"] - rows[0]["time_s"])

    @property
    def final_metrics(self) -> dict[str, Any]:
        """Rank 0's last report."""
        rows = self.rank0()
        return {k: v for k, v in rows[-1].items() if k not in ("report", "rank")} if rows else {}

    def metric(self, key: str) -> list[float]:
        """Rank 0's values of ``key`` in report order."""
        return [r[key] for r in self.rank0() if key in r]

    def to_pandas(self) -> Any:
        """The records as a ``pandas.DataFrame`` (one row per report and rank)."""
        import pandas as pd

        return pd.DataFrame.from_records(self.records)

    def summary(self) -> dict[str, Any]:
        """A JSON-able summary: wall time, steps, steps/s, final metrics, slices, storage."""
        return {"name": self.name, "pod_type": self.shape.pod_type, "topology": self.shape.topology,
                "slices": self.slice_names, "workers": self.num_workers,
                "wall_s": round(self.wall_s, 1), "steps": self.steps,
                "steps_per_s": round(self.steps_per_s, 2), "final_metrics": self.final_metrics,
                "storage_path": self.storage_path, "error": self.error}

    def __repr__(self) -> str:
        state = "failed" if self.error else "finished"
        return (f"RunResult({self.name!r} {state}: {self.shape.pod_type} x{self.num_slices} on "
                f"{self.slice_names}, {self.steps} steps in {self.wall_s:.1f} s)")


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
    poll_interval_s: float = 0.5,
) -> RunResult:
    """Run ``train_fn`` with ``JaxTrainer`` on ``num_slices`` slices of ``shape``; block until done.

    Args:
        train_fn: The per-worker training function, ``train_fn(config)`` or ``train_fn()``; it
            calls ``ray.train.report(metrics)`` to report (every rank must call it equally often).
        shape: Generation and topology of each slice.
        name: Run name.
        num_slices: Slices to train on (multi-slice when > 1).
        config: Passed to ``train_fn`` as ``train_loop_config``.
        storage_path: Ray Train's storage (local dir or ``gs://``); Ray's default if ``None``.
        snapshot: Returns a cluster snapshot; used to find the slices the run landed on.
        on_records: Called from a background thread with each batch of new records, at most
            every ``poll_interval_s`` seconds (for a live chart).
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
    trainer = JaxTrainer(
        train_fn,
        train_loop_config=config,
        scaling_config=ScalingConfig(
            use_tpu=True, topology=shape.topology, accelerator_type=shape.accelerator_type,
            num_workers=shape.num_hosts * num_slices),
        run_config=RunConfig(name=name, storage_path=storage_path, callbacks=[_StreamReports(queue)]),
    )
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
                result.slice_names = _new_slices(snapshot(), known_pgs)
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
        if getattr(ray_result, "error", None) is not None:
            raise ray_result.error
    except TrainingFailedError as err:
        result.error = _worker_error_text(err)
        raise TrainingError(
            f"Training run {name!r} failed on its workers.",
            why=result.error, fix="Fix the training function and run the cell again; "
            "the slices were freed.", run_name=name, worker_error=result.error) from None
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, previous_sigint)  # Ray Train's fit() installs its own
        result.wall_s = time.monotonic() - start
        stop.set()
        poller.join(timeout=10)
        _shutdown_queue(queue)
    return result


def _placement_group_ids() -> set[str]:
    return set(ray.util.placement_group_table())


def _new_slices(snap: ClusterSnapshot, known_pgs: set[str]) -> list[str]:
    """Slices held by placement groups that appeared after launch (the run's)."""
    new_owners = {f"placement group {pg[:8]}" for pg in _placement_group_ids() - known_pgs}
    return [s.name for s in snap.slices if new_owners & set(s.owners)]


def _worker_error_text(err: TrainingFailedError) -> str:
    failures = getattr(err, "worker_failures", None) or {}
    if failures:
        rank, exc = sorted(failures.items())[0]
        more = f" (and {len(failures) - 1} more rank(s))" if len(failures) > 1 else ""
        return f"rank {rank}{more}:\n{exc}"
    return str(err)


def _shutdown_queue(queue: Queue) -> None:
    try:
        queue.shutdown(force=True)
    except Exception:  # the cluster may be gone already; the actor dies with it
        pass
