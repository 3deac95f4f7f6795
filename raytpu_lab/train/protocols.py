"""The shapes that cross a training run's boundaries, declared once. Pure: no Ray.

Three streams reach the driver while a run lives, each through a Ray queue actor:

- the **events** queue: one :data:`RunEvent` per item, told apart by ``kind``:
  ``"reports"`` (a round of ``ray.train.report`` from Ray Train's controller),
  ``"controller"`` (the controller's handle, for Stop) and ``"tap"`` (rows from the worker tap,
  :mod:`raytpu_lab.train.worker_tap`, each a :data:`TapRow` told apart by its own ``kind``:
  ``"placement"``, ``"error"``, ``"summary"``);
- the **logs** queue: one :class:`LogBatch` per worker and flush;
- and after the run, :meth:`RunResult.summary() <raytpu_lab.train.result.RunResult.summary>`:
  a :class:`RunSummary` (``trainer: "jax"``) or, for PyTorch/XLA runs, a :class:`TorchRunSummary`
  (``trainer: "torch"``).

A record (:data:`Record`) is one report of one rank: ``{"report": i, "rank": r, "time_s": t,
**metrics}``; its metric keys are whatever the training function reported, so it stays a dict.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

__all__ = [
    "ControllerEvent", "ErrorRow", "LogBatch", "PlacementRow", "Record", "ReportsEvent",
    "RunEvent", "RunSummary", "SummaryRow", "TapEvent", "TapRow", "TorchRunSummary", "Trainer",
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


TapRow = PlacementRow | ErrorRow | SummaryRow


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


RunEvent = ReportsEvent | ControllerEvent | TapEvent


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


class TorchRunSummary(RunSummary):
    """A PyTorch/XLA run's summary: :class:`RunSummary` plus backend and XLA compiles."""

    backend: str
    pjrt_device: str
    xla_compiles: int | None
    xla_compile_time_s: float | None
    recompilation_storm: list[int]
