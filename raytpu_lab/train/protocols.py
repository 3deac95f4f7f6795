"""The shapes that cross a training run's boundaries, declared once. Pure: no Ray.

Three streams reach the driver while a run lives, each through a Ray queue actor:

- the **events** queue: one :data:`RunEvent` per item, told apart by ``kind``:
  ``"reports"`` (a round of ``ray.train.report`` from Ray Train's controller),
  ``"controller"`` (the controller's handle, for Stop), ``"restart"`` (Ray Train's controller
  restarting the worker group, :class:`RestartEvent`) and ``"tap"`` (rows from the worker tap,
  :mod:`raytpu_lab.train.worker_tap`, each a :data:`TapRow` told apart by its own ``kind``:
  ``"placement"``, ``"error"``, ``"summary"``);
- the **logs** queue: one :class:`LogBatch` per worker and flush;
- and after the run, :meth:`RunResult.summary() <raytpu_lab.train.result.RunResult.summary>`:
  a :class:`RunSummary` (``trainer: "jax"``) or, for PyTorch/XLA runs, a :class:`TorchRunSummary`
  (``trainer: "torch"``).

A record (:data:`Record`) is one report of one rank: ``{"report": i, "rank": r, "time_s": t,
**metrics}``; its metric keys are whatever the training function reported, so it stays a dict.
Records and placement rows of a restarted run's later worker groups also carry ``"attempt": n``
(1 for the first restart; absent means 0), added in the driver as they arrive.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

__all__ = [
    "AttemptRow", "ControllerEvent", "ErrorRow", "LogBatch", "PlacementRow", "Record",
    "ReportsEvent", "RestartEvent", "RestartRow", "RunEvent", "RunSummary", "SummaryRow",
    "TapEvent", "TapRow", "TimingRow", "TorchRunSummary", "Trainer",
]

Trainer = Literal["jax", "torch"]
"""Which Ray Train trainer ran: ``JaxTrainer`` (a worker per host) or ``TorchTrainer`` (per chip)."""

Record = dict[str, Any]
"""One report of one rank: ``{"report": int, "rank": int, "time_s": float, **metrics}``."""


class PlacementRow(TypedDict):
    """Where one rank runs, sent once when its worker starts."""

    kind: Literal["placement"]
    rank: int
    local_rank: int
    world_size: int
    node_id: str
    host: str
    hostname: str
    pid: int
    slice: str
    worker_id: int | None
    chips: list[str]
    megascale_coordinator_address: str | None
    megascale_num_slices: str | None
    megascale_slice_id: str | None


class ErrorRow(TypedDict):
    """One rank's exception, sent before it propagates."""

    kind: Literal["error"]
    rank: int
    node_id: str
    host: str
    slice: str
    worker_id: int | None
    error: str
    traceback: str


class SummaryRow(TypedDict):
    """What a worker's ``worker_summary`` function returned when its function ended."""

    kind: Literal["summary"]
    rank: int
    summary: dict[str, Any]


class TimingRow(TypedDict):
    """When one rank's worker started and its function ran (epoch seconds), for goodput
    (:mod:`raytpu_lab.train.goodput`): ``reports`` holds ``[start, end, with_checkpoint]`` of
    each ``ray.train.report`` call; ``fn_end`` is ``None`` while the function runs;
    ``cpu_devices``: JAX or PJRT runs on CPU devices (the emulator's stand-ins for chips)."""

    kind: Literal["timing"]
    rank: int
    process_start: float | None
    fn_start: float
    fn_end: float | None
    reports: list[tuple[float, float, bool]]
    cpu_devices: bool


TapRow = PlacementRow | ErrorRow | SummaryRow | TimingRow


class ReportsEvent(TypedDict):
    """One round of reports (every rank), from Ray Train's controller."""

    kind: Literal["reports"]
    rows: list[Record]


class ControllerEvent(TypedDict):
    """Ray Train's controller announcing its actor handle (what Stop aborts) and pid."""

    kind: Literal["controller"]
    handle: Any
    pid: int


class TapEvent(TypedDict):
    """Rows of the worker tap (one worker's placement, error or summary)."""

    kind: Literal["tap"]
    rows: list[TapRow]


class RestartEvent(TypedDict):
    """Ray Train's controller restarting the run (``RESTARTING``: the worker group failed while
    running; ``RESCHEDULING``: it failed to start), from
    :func:`raytpu_lab._ray_private.restart_reporter`."""

    kind: Literal["restart"]
    time: float
    state: str
    errors: dict[int, str]
    error: str


class RestartRow(TypedDict):
    """A restart as the run's result keeps it: ``at_s`` seconds since launch, the controller
    state, each failed rank's error and Ray's whole error text."""

    at_s: float
    state: str
    errors: dict[int, str]
    error: str


class AttemptRow(TypedDict):
    """One worker group of a run (:meth:`RunResult.attempts
    <raytpu_lab.train.result.RunResult.attempts>`), seconds since launch.

    ``outcome``: ``"restarted"`` (it failed and Ray Train started another), else the run's end
    (``"finished"``, ``"failed"``, ``"stopped"``) or ``"running"``. ``cause``: which ranks,
    hosts and slices failed and why; ``lost_s``: seconds from this attempt's start until the
    next one reported (the work redone plus the restart), ``None`` when not restarted.
    ``megascale``: per rank, the ``MEGASCALE_*`` values its worker saw.
    """

    attempt: int
    started_s: float
    ended_s: float | None
    outcome: Literal["running", "restarted", "finished", "failed", "stopped"]
    slices: list[str]
    hosts: list[str]
    failed_ranks: list[int]
    failed_hosts: list[str]
    failed_slices: list[str]
    cause: str
    lost_s: float | None
    megascale: list[dict[str, Any]]


RunEvent = ReportsEvent | ControllerEvent | RestartEvent | TapEvent


class LogBatch(TypedDict):
    """New log lines of one rank: ``lines`` as ``(stream, text)``, ``stream`` ``"stdout"`` or
    ``"stderr"``; ``dropped``: lines skipped since the last batch; ``time``: epoch seconds."""

    rank: int
    time: float
    lines: list[tuple[str, str]]
    dropped: int


class RunSummary(TypedDict):
    """:meth:`RunResult.summary`: JSON-able, seconds in ``wall_s``."""

    trainer: Trainer
    name: str
    pod_type: str
    topology: str
    slices: list[str]
    workers: int
    wall_s: float
    steps: int
    counts: Literal["steps", "reports"]
    steps_per_s: float
    final_metrics: dict[str, Any]
    storage_path: str
    error: str | None
    stopped: bool
    goodput: dict[str, Any]
    mfu: dict[str, Any]
    restarts: int


class TorchRunSummary(RunSummary):
    """A PyTorch/XLA run's summary: :class:`RunSummary` plus backend and XLA compiles."""

    backend: str
    pjrt_device: str
    xla_compiles: int | None
    xla_compile_time_s: float | None
    recompilation_storm: list[int]
