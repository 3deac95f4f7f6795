"""The result of a training run: every report of every rank, timing and placement. Pure (no Ray).

:class:`RunResult` is the one accumulator of a run's stream: the drain thread folds each
:class:`RunUpdate` into it (:meth:`RunResult.absorb`), and the live dashboard, its static copy and
``last_run`` all read it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from raytpu_lab.tpu.topology import SliceShape
from raytpu_lab.train.attempts import attempt_rows
from raytpu_lab.train.goodput import Goodput, split_goodput
from raytpu_lab.train.mfu import Mfu, compute_mfu
from raytpu_lab.train.protocols import (
    AttemptRow,
    ErrorRow,
    PlacementRow,
    Record,
    RestartRow,
    RunSummary,
    TimingRow,
    Trainer,
)
from raytpu_lab.train.streams import LogBook, placement_table

__all__ = ["RunResult", "RunUpdate", "progress", "Counts"]

Counts = Literal["steps", "reports"]
_INDEX_LOCK = threading.Lock()  # by_rank() runs in the drain thread and the kernel's (no field:
#                                 a result stays copyable and picklable)


def progress(rows: Sequence[Mapping[str, Any]]) -> tuple[int, float, Counts]:
    """``(count, per second, what is counted)`` of one rank's reports, in report order.

    Counts steps (the last ``step`` + 1, rate between the first and last report that carry
    ``step``) when the last report has a ``step`` key, else reports (one per
    ``ray.train.report``). The rate is 0.0 with fewer than two reports or no time between them.
    The run result and the live dashboard both use this rule.
    """
    what: Counts = "steps" if rows and "step" in rows[-1] else "reports"
    if what == "steps":
        span = [r for r in rows if "step" in r]
        count = int(span[-1]["step"]) + 1
        done = float(span[-1]["step"] - span[0]["step"])
    else:
        span, count, done = list(rows), len(rows), float(len(rows) - 1)
    if len(span) < 2 or span[-1]["time_s"] <= span[0]["time_s"]:
        return count, 0.0, what
    return count, done / (span[-1]["time_s"] - span[0]["time_s"]), what


@dataclass
class RunUpdate:
    """What arrived since the last update (one drain of the queues).

    Attributes:
        elapsed_s: Seconds since launch.
        records: New reports, ``{"report", "rank", "time_s", **metrics}``.
        workers: New placement rows (one per rank when the workers start).
        logs: New log lines, ``(rank, stream, text)``; ``dropped`` counts lines workers skipped.
        log_times: Per rank, when its newest log batch was sent (epoch seconds); lines of ranks
            not in it are stamped with ``elapsed_s``.
        errors: New worker errors (rank, host, traceback...).
        slices: The slices the run landed on, once known (``[]`` before).
        timings: New worker timing rows (when each rank started, its reports' spans).
        placed_s: Seconds since launch when the run's slices were first seen held, in the
            update that first saw them.
        restarts: Restarts of the worker group by Ray Train's controller (``max_failures``).
        result: The run's result, with this update folded in (set by :meth:`RunResult.absorb`).
    """

    elapsed_s: float
    records: list[Record] = field(default_factory=list)
    workers: list[PlacementRow] = field(default_factory=list)
    logs: list[tuple[int, str, str]] = field(default_factory=list)
    dropped: dict[int, int] = field(default_factory=dict)
    log_times: dict[int, float] = field(default_factory=dict)
    errors: list[ErrorRow] = field(default_factory=list)
    slices: list[str] = field(default_factory=list)
    timings: list[TimingRow] = field(default_factory=list)
    placed_s: float | None = None
    restarts: list[RestartRow] = field(default_factory=list)
    result: RunResult | None = None

    @property
    def empty(self) -> bool:
        return not (self.records or self.workers or self.logs or self.dropped or self.errors
                    or self.timings or self.restarts)


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
        workers: One placement row per rank as the worker tap sent it (rank, node id, host IP,
            slice, worker id, chips, ``megascale_*``, pid); see :meth:`placement`.
        worker_errors: ``{"rank", "host", "node_id", "slice", "worker_id", "error",
            "traceback"}`` for each rank that raised.
        logs: The last lines each rank printed (capped per rank; see :meth:`log_records`).
        stopped: The run was stopped (Stop button, ``stop()`` or an interrupt) before it ended.
        worker_summaries: ``{rank: summary}`` each worker sent when its function ended, for
            trainers that ask for one (PyTorch/XLA runs: torch_xla's metrics); ``{}`` otherwise.
        launched_at: Epoch seconds at launch (the workers' timestamps are converted with it).
        placed_s: Seconds from launch until the run's slices were seen held, or ``None``.
        timings: ``{rank: TimingRow}`` each worker sent when its function ended (see
            :meth:`goodput`).
        flops_per_step: Model FLOPs of one step, all chips, as the user gave them (the run
            config's ``flops_per_step`` key), or ``None`` (see :meth:`mfu`).
        restarts: Each restart of the worker group by Ray Train's controller (runs with
            ``max_failures``), in order; see :meth:`attempts`.
    """

    name: str
    shape: SliceShape
    num_slices: int
    records: list[Record] = field(default_factory=list)
    wall_s: float = 0.0
    slice_names: list[str] = field(default_factory=list)
    storage_path: str = ""
    error: str | None = None
    ray_result: Any = None
    workers: list[PlacementRow] = field(default_factory=list)
    worker_errors: list[ErrorRow] = field(default_factory=list)
    logs: LogBook = field(default_factory=LogBook)
    stopped: bool = False
    worker_summaries: dict[int, dict[str, Any]] = field(default_factory=dict)
    launched_at: float = 0.0
    placed_s: float | None = None
    timings: dict[int, TimingRow] = field(default_factory=dict)
    flops_per_step: float | None = None
    restarts: list[RestartRow] = field(default_factory=list)
    _by_rank: dict[int, list[Record]] = field(default_factory=dict, init=False, repr=False,
                                              compare=False)
    _indexed: int = field(default=0, init=False, repr=False, compare=False)

    #: Which trainer ran (the discriminator of :meth:`summary`).
    trainer: Trainer = field(default="jax", init=False)

    def absorb(self, update: RunUpdate) -> RunUpdate:
        """Fold ``update`` in (records, placement rows, errors, log lines, slices); return it
        with :attr:`RunUpdate.result` set to this result. The drain thread calls it once per
        update, before any listener sees the update."""
        self.records.extend(update.records)
        self.workers.extend(update.workers)
        self.worker_errors.extend(update.errors)
        self.restarts.extend(update.restarts)
        by_rank: dict[int, list[tuple[str, str]]] = {}
        for rank, stream, text in update.logs:
            by_rank.setdefault(rank, []).append((stream, text))
        for rank in sorted(set(by_rank) | set(update.dropped)):
            self.logs.add(rank, by_rank.get(rank, []), dropped=update.dropped.get(rank, 0),
                          time_s=update.log_times.get(rank, update.elapsed_s))
        if update.slices:
            self.slice_names = list(update.slices)
        if update.placed_s is not None and self.placed_s is None:
            self.placed_s = update.placed_s
        for row in update.timings:
            self.timings[int(row["rank"])] = row
        update.result = self
        return update

    def lead_with_worker_error(self) -> None:
        """A failed run: lead :attr:`error` with what the worker tap saw of the first failing
        rank (rank, host, slice, traceback); nothing when it did not fail or no rank raised."""
        if self.error is None or not self.worker_errors:
            return
        first = sorted(self.worker_errors, key=lambda e: e["rank"])[0]
        where = f"rank {first['rank']} on host {first.get('host') or '?'}"
        if first.get("slice"):
            where += f" ({first['slice']} worker {first.get('worker_id')})"
        more = len({e["rank"] for e in self.worker_errors}) - 1
        self.error = (f"{where}{f' (and {more} more rank(s))' if more > 0 else ''}: "
                      f"{first['error']}\n{first['traceback'].rstrip()}")

    def by_rank(self) -> dict[int, list[Record]]:
        """``{rank: its records in report order}`` (kept up to date as records arrive)."""
        with _INDEX_LOCK:
            new = self.records[self._indexed:]
            for r in new:
                self._by_rank.setdefault(int(r["rank"]), []).append(r)
            self._indexed += len(new)
            return self._by_rank

    def attempts(self) -> list[AttemptRow]:
        """One row per worker group Ray Train started for the run (one without restarts): where
        it ran, its ``MEGASCALE_*`` values per rank, why it ended and the seconds lost (see
        :func:`~raytpu_lab.train.attempts.attempt_rows`)."""
        ended = None if not self.wall_s else (
            "failed" if self.error else "stopped" if self.stopped else "finished")
        return attempt_rows(self.restarts, self.workers, self.records, wall_s=self.wall_s,
                            ended=ended)

    @property
    def num_workers(self) -> int:
        """Ray Train workers: the ranks that reported their placement, else one per host (as
        host-centric JAX runs)."""
        return len({w["rank"] for w in self.workers}) or self.shape.num_hosts * self.num_slices

    def rank0(self) -> list[Record]:
        """Records of rank 0, in report order."""
        return list(self.by_rank().get(0, []))

    @property
    def counts(self) -> Counts:
        """What :attr:`steps` and :attr:`steps_per_s` count: ``"steps"`` when rank 0 reports a
        ``step`` key, else ``"reports"`` (one per ``ray.train.report`` call, e.g. a run that
        reports ``epoch`` only)."""
        return progress(self.rank0())[2]

    @property
    def steps(self) -> int:
        """Training steps seen: the last reported ``step`` + 1, or the number of reports when
        there is no ``step`` key (see :attr:`counts`)."""
        return progress(self.rank0())[0]

    @property
    def steps_per_s(self) -> float:
        """Steps (or reports, see :attr:`counts`) per second between the first and the last
        report of rank 0 (compile excluded); 0.0 with fewer than two reports."""
        return progress(self.rank0())[1]

    @property
    def final_metrics(self) -> dict[str, Any]:
        """Rank 0's last report: what the training function passed to ``ray.train.report``
        (without the ``report``, ``rank`` and ``time_s`` keys of :attr:`records`)."""
        rows = self.rank0()
        return ({k: v for k, v in rows[-1].items()
                 if k not in ("report", "rank", "time_s", "attempt")}
                if rows else {})

    def metric(self, key: str) -> list[float]:
        """Rank 0's values of ``key`` in report order."""
        return [r[key] for r in self.rank0() if key in r]

    def placement(self) -> list[dict[str, Any]]:
        """Where each rank ran: one row per rank (``rank, slice, worker_id, host, node_id, chips,
        megascale_slice_id, pid``), sorted by rank."""
        return placement_table(self.workers)

    def log_records(self, rank: int | None = None) -> list[dict[str, Any]]:
        """Kept log lines as ``{"rank", "stream", "time", "line"}``, all ranks or one."""
        rows = self.logs.records()
        return rows if rank is None else [r for r in rows if r["rank"] == rank]

    def to_pandas(self, what: str = "records") -> Any:
        """A ``pandas.DataFrame`` of ``"records"`` (one row per report and rank, the default),
        ``"placement"`` (one row per rank) or ``"logs"`` (one row per kept log line).

        Raises:
            ValueError: ``what`` is none of those.
        """
        import pandas as pd

        rows = {"records": self.records, "placement": self.placement(),
                "logs": self.log_records()}.get(what)
        if rows is None:
            raise ValueError(f"to_pandas({what!r}): pick 'records', 'placement' or 'logs'")
        return pd.DataFrame.from_records(rows)

    def goodput(self, rank: int = 0) -> Goodput:
        """Where the wall time went (seconds per part of
        :data:`~raytpu_lab.train.goodput.GOODPUT_PARTS`), from rank ``rank``'s timestamps (see
        :mod:`raytpu_lab.train.goodput`); all ``other`` until that rank's function ended."""
        row = self.timings.get(rank)
        if row is None:
            return split_goodput(self.wall_s, placed_s=self.placed_s, process_start_s=None,
                                 fn_start_s=None, fn_end_s=None)
        t0 = self.launched_at

        def rel(t: float | None) -> float | None:
            return None if t is None else t - t0

        return split_goodput(
            self.wall_s, placed_s=self.placed_s, process_start_s=rel(row["process_start"]),
            fn_start_s=rel(row["fn_start"]), fn_end_s=rel(row["fn_end"]),
            reports=[(s - t0, e - t0, bool(c)) for s, e, c in row["reports"]])

    def mfu(self, flops_per_step: float | None = None) -> Mfu:
        """Model FLOPs utilisation (see :mod:`raytpu_lab.train.mfu`): FLOPs per step from
        ``flops_per_step`` (all chips), else :attr:`flops_per_step`, else the last
        ``flops_per_step`` metric rank 0 reported (XLA's count, :func:`~raytpu_lab.train.mfu.xla_flops`);
        seconds per step from :attr:`steps_per_s` (per report when there is no ``step`` key);
        chips: the shape's chips times the slices. On CPU devices (the emulator) it gives the
        FLOP/s and no percentage.

        Raises:
            ValueError: ``flops_per_step`` is negative.
        """
        source = "user" if flops_per_step is not None or self.flops_per_step is not None else ""
        flops = flops_per_step if flops_per_step is not None else self.flops_per_step
        if flops is None:
            reported = self.metric("flops_per_step")
            flops, source = (float(reported[-1]), "xla") if reported else (None, "")
        rate = self.steps_per_s
        emulated = any(t.get("cpu_devices") for t in self.timings.values())
        return compute_mfu(flops, 1.0 / rate if rate > 0 else None,
                           chips=self.shape.num_chips * self.num_slices,
                           version=self.shape.version, emulated=emulated, source=source)

    def summary(self) -> RunSummary:
        """A JSON-able summary: wall time, steps, steps/s, final metrics, slices, storage.

        ``steps`` and ``steps_per_s`` count reports when rank 0 reports no ``step`` key;
        ``counts`` says which (``"steps"`` or ``"reports"``); ``trainer`` says which trainer
        ran (``"torch"``: the summary is a
        :class:`~raytpu_lab.train.protocols.TorchRunSummary`)."""
        return {"trainer": self.trainer, "name": self.name, "pod_type": self.shape.pod_type, "topology": self.shape.topology,
                "slices": self.slice_names, "workers": self.num_workers,
                "wall_s": round(self.wall_s, 1), "steps": self.steps, "counts": self.counts,
                "steps_per_s": round(self.steps_per_s, 2), "final_metrics": self.final_metrics,
                "storage_path": self.storage_path, "error": self.error, "stopped": self.stopped,
                "goodput": self.goodput().to_dict(), "mfu": self.mfu().to_dict(),
                "restarts": len(self.restarts)}

    def __repr__(self) -> str:
        state = "failed" if self.error else "stopped" if self.stopped else "finished"
        return (f"RunResult({self.name!r} {state}: {self.shape.pod_type} x{self.num_slices} on "
                f"{self.slice_names}, {self.steps} {self.counts} in {self.wall_s:.1f} s)")
