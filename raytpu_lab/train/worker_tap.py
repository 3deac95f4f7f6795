"""The worker side of a watched run: where each rank landed, what it printed, how it failed.

:func:`tap_train_fn` wraps the user's per-worker function before it goes to Ray Train (any
trainer: ``JaxTrainer``, ``TorchTrainer``...). In each worker the wrapper

Every row goes to the ``events`` queue as a ``{"kind": "tap", "rows": [row]}`` item; the shapes are
:class:`~raytpu_lab.train.protocols.TapEvent` and its rows.

1. sends one placement row to the ``events`` queue: rank, node id, host IP, pid, the slice name and
   worker id from the node's labels (``ray.io/tpu-slice-name``, ``ray.io/tpu-worker-id``, which Ray
   derives from the GKE/KubeRay TPU environment), the chips Ray assigned
   (``get_accelerator_ids()["TPU"]``) and the ``MEGASCALE_*`` variables of multi-slice runs;
2. tees ``sys.stdout`` / ``sys.stderr``: lines still reach the worker's own log files (so Ray's
   log tools keep them) and, every ``flush_interval_s``, go as one batch to the ``logs`` queue
   (Ray's own INFO chatter excepted, see :func:`_not_for_the_panes`); a
   worker printing faster than ``max_lines_per_flush`` lines per interval sends the last ones and
   the count it dropped, so a flood never backs up the queue;
3. calls the function; if it raises, sends ``{"kind": "error", rank, host, traceback}`` first;
4. if given a ``worker_summary`` function, sends ``{"kind": "summary", "rank", "summary": ...}``
   when the function ends (PyTorch/XLA runs send torch_xla's metrics this way, so they stay out
   of the run's metric reports).

It never lets a full or gone queue fail the training function.
"""

from __future__ import annotations

import functools
import inspect
import io
import logging
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from raytpu_lab.errors import TrainingConfigError
from raytpu_lab.tpu.labels import LABEL_SLICE, LABEL_WORKER
from raytpu_lab.train.protocols import ErrorRow, LogBatch, PlacementRow, TapEvent, TapRow, TimingRow

__all__ = ["accepts_config", "check_names", "tap_train_fn", "SLICE_LABEL", "WORKER_ID_LABEL"]

SLICE_LABEL = LABEL_SLICE
WORKER_ID_LABEL = LABEL_WORKER


def accepts_config(fn: Callable[..., Any]) -> bool:
    """Whether Ray Train will call ``fn(config)`` (True) or ``fn()`` (False).

    Ray Train (``ray.train._internal.utils.construct_train_func``) counts required parameters:
    0 means ``fn()``, 1 means ``fn(config)``, more is refused when the run starts. Checked here
    before any resources are taken.

    Raises:
        TrainingConfigError: ``fn`` is not callable, is an ``async`` function, needs more than
            one argument, or its one required argument is keyword-only.
    """
    if not callable(fn):
        raise TrainingConfigError(f"{fn!r} is not a function.",
                                  fix="Pass the per-worker training function, f(config) or f().")
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        name = getattr(fn, "__name__", "the training function")
        raise TrainingConfigError(
            f"{name} is an async function; it cannot be the per-worker training function.",
            why="Ray Train calls it as a plain function: its body would never run.",
            fix=f"Define it with def, not async def: def {name}(config): ...")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return True  # builtins without a signature: let Ray Train decide
    required = [p for p in params if p.default is inspect.Parameter.empty
                and p.kind is not inspect.Parameter.VAR_KEYWORD]
    name = getattr(fn, "__name__", "the training function")
    if len(required) > 1 or (required and required[0].kind is inspect.Parameter.KEYWORD_ONLY):
        shown = ", ".join(p.name for p in required)
        raise TrainingConfigError(
            f"{name}({shown}) cannot be the per-worker training function.",
            why="Ray Train calls it as f(config) (the train_loop_config dict) or f().",
            fix=f"Define it as def {name}(config): ... or def {name}(): ...")
    return bool(required)


_DYNAMIC = frozenset({"globals", "exec", "eval", "vars", "locals", "__builtins__"})


def check_names(fn: Callable[..., Any]) -> None:
    """Refuse a training function that would fail with ``NameError`` on every worker.

    A global name the function (or a function nested in it) reads, that is neither in its
    module's globals now nor a builtin, nor assigned with ``global`` anywhere in it, cannot
    exist on the workers either: Ray pickles the function with the globals it uses when the run
    starts. Found here in milliseconds instead of after the slices are taken and every worker
    has started (a minute or more on a busy machine). Functions that reach their globals
    dynamically (``globals()``, ``exec``, ``eval``, ``vars``) are not checked.

    Raises:
        TrainingConfigError: Names the undefined names and the line of the first.
    """
    code = getattr(fn, "__code__", None)
    namespace = getattr(fn, "__globals__", None)
    if code is None or not isinstance(namespace, dict):
        return
    import builtins
    import dis

    loads: dict[str, int | None] = {}
    stored: set[str] = set()
    todo = [code]
    while todo:
        current = todo.pop()
        todo.extend(c for c in current.co_consts if hasattr(c, "co_code"))
        for inst in dis.get_instructions(current):
            if inst.opname == "LOAD_GLOBAL" and isinstance(inst.argval, str):
                positions = getattr(inst, "positions", None)  # Python 3.11+
                line = positions.lineno if positions is not None else inst.starts_line
                loads.setdefault(inst.argval, line)
            elif inst.opname in ("STORE_GLOBAL", "DELETE_GLOBAL"):
                stored.add(str(inst.argval))
    if _DYNAMIC & set(loads):
        return
    missing = [n for n in loads if n not in namespace and not hasattr(builtins, n)
               and n not in stored]
    if not missing:
        return
    name = getattr(fn, "__name__", "the training function")
    line = loads[missing[0]]
    shown = ", ".join(missing)
    raise TrainingConfigError(
        f"{name} uses {shown}, which {'is' if len(missing) == 1 else 'are'} not defined"
        f"{f' (line {line})' if line else ''}: it would fail with NameError on every worker.",
        why="Names a training function reads must be defined in it, imported in it, or defined "
            "in the notebook (or its module) before the run starts; Ray ships them with it.",
        fix="Fix the name, or define or import it first, then run the cell again; nothing "
            "was started.")


def tap_train_fn(train_fn: Callable[..., Any], events: Any, logs: Any, *,
                 flush_interval_s: float = 0.25,
                 max_lines_per_flush: int = 400,
                 worker_summary: Callable[[], dict[str, Any]] | None = None) -> Callable[..., Any]:
    """Wrap ``train_fn`` so each worker reports placement, log lines and errors.

    Args:
        train_fn: The user's per-worker function (checked with :func:`accepts_config`).
        events: A ``ray.util.queue.Queue``; gets :class:`~raytpu_lab.train.protocols.TapEvent`
            items (a placement row, an error row, a summary row).
        logs: A ``ray.util.queue.Queue``; gets :class:`~raytpu_lab.train.protocols.LogBatch`
            items, one per worker and flush.
        flush_interval_s: Seconds between log batches of one worker.
        max_lines_per_flush: Lines kept per batch; older ones are counted in ``dropped``.
        worker_summary: Called in each worker when ``train_fn`` returns or raises; its JSON-able
            dict is sent as that rank's summary. Must be picklable (a module-level function). If
            it raises, no summary is sent.

    Returns:
        A function of the same arity (``f(config)`` or ``f()``) for the trainer.
    """
    takes_config = accepts_config(train_fn)

    def run(config: Any) -> Any:
        fn_start = time.time()
        info = _placement()
        _put(events, _tap(info))
        tee = _Tee(info["rank"], logs, flush_interval_s, max_lines_per_flush)
        tee.start()
        timing = _ReportTimer(info["rank"], fn_start)
        try:
            with timing:
                return train_fn(config) if takes_config else train_fn()
        except BaseException as err:
            error: ErrorRow = {
                "kind": "error", "rank": info["rank"], "node_id": info["node_id"],
                "host": info["host"], "slice": info["slice"], "worker_id": info["worker_id"],
                "error": f"{type(err).__name__}: {err}",
                "traceback": "".join(traceback.format_exception(
                    type(err), err, err.__traceback__.tb_next if err.__traceback__ else None))}
            _put(events, _tap(error))
            raise
        finally:
            _put(events, _tap(timing.row()))
            if worker_summary is not None:
                _send_summary(events, info["rank"], worker_summary)
            tee.stop()

    if takes_config:
        @functools.wraps(train_fn)
        def with_config(config: Any) -> Any:
            return run(config)
        return with_config

    @functools.wraps(train_fn)
    def without_config() -> Any:
        return run(None)
    return without_config


class _ReportTimer:
    """While the function runs, times every ``ray.train.report`` call through Ray Train's own
    hook point (:func:`raytpu_lab._ray_private.wrap_train_report`, which also sees a ``report``
    imported from ``ray.train``): the function itself is unchanged. Outside a Ray Train worker
    nothing is timed."""

    def __init__(self, rank: int, fn_start: float) -> None:
        self.rank = rank
        self.fn_start = fn_start
        self.fn_end: float | None = None
        self.reports: list[tuple[float, float, bool]] = []
        self._undo: Callable[[], None] | None = None

    def _around(self, report: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        start = time.time()
        try:
            return report(*args, **kwargs)
        finally:
            checkpoint = kwargs.get("checkpoint", args[1] if len(args) > 1 else None)
            self.reports.append((start, time.time(), checkpoint is not None))

    def __enter__(self) -> _ReportTimer:
        try:
            from raytpu_lab import _ray_private

            self._undo = _ray_private.wrap_train_report(self._around)
        except Exception:  # outside a Ray Train worker: nothing to time
            self._undo = None
        return self

    def __exit__(self, *exc: Any) -> None:
        self.fn_end = time.time()
        if self._undo is not None:
            self._undo()

    def row(self) -> TimingRow:
        return {"kind": "timing", "rank": self.rank, "process_start": _process_start(),
                "fn_start": self.fn_start, "fn_end": self.fn_end, "reports": list(self.reports),
                "cpu_devices": os.environ.get("JAX_PLATFORMS", "").lower() == "cpu"
                or os.environ.get("PJRT_DEVICE", "").upper() == "CPU"}


def _process_start() -> float | None:
    """When this worker process was created (epoch seconds), or ``None`` if unknown."""
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:
        return None


def _send_summary(events: Any, rank: int, worker_summary: Callable[[], dict[str, Any]]) -> None:
    try:
        summary = worker_summary()
    except Exception:  # a summary must never fail (or mask the error of) the training run
        return
    _put(events, _tap({"kind": "summary", "rank": rank, "summary": dict(summary)}))


def _tap(row: TapRow) -> TapEvent:
    return {"kind": "tap", "rows": [row]}


def _put(queue: Any, item: Any) -> None:
    try:
        queue.put_nowait(item)
    except Exception:  # a full or gone queue must never fail the training run
        pass


def _placement() -> PlacementRow:
    import ray
    import ray.train

    ctx = ray.get_runtime_context()
    try:
        train_ctx = ray.train.get_context()
        rank, local_rank = train_ctx.get_world_rank(), train_ctx.get_local_rank()
        world_size = train_ctx.get_world_size()
    except Exception:  # outside Ray Train (a plain task): still say where it ran
        rank, local_rank, world_size = 0, 0, 1
    labels: dict[str, Any] = dict(ctx.get_node_labels() or {})
    chips = ctx.get_accelerator_ids().get("TPU", [])
    worker_id = str(labels.get(WORKER_ID_LABEL, os.environ.get("TPU_WORKER_ID", "")))
    return {"kind": "placement", "rank": rank, "local_rank": local_rank, "world_size": world_size,
            "node_id": ctx.get_node_id(), "host": ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
            "hostname": socket.gethostname(), "pid": os.getpid(),
            "slice": labels.get(SLICE_LABEL, os.environ.get("TPU_NAME", "")),
            "worker_id": int(worker_id) if worker_id.isdigit() else None,
            "chips": [str(c) for c in chips],
            "megascale_slice_id": os.environ.get("MEGASCALE_SLICE_ID"),
            "megascale_num_slices": os.environ.get("MEGASCALE_NUM_SLICES"),
            "megascale_coordinator_address": os.environ.get("MEGASCALE_COORDINATOR_ADDRESS")}


def _not_for_the_panes() -> bool:
    """Whether this stderr write is Ray's own chatter rather than the training function's output.

    Two cases, told apart by the calling frames (a user's ``print(..., file=sys.stderr)`` or
    ``logging`` call matches neither):

    - Ray Train's echo of a ``print`` we already captured: Ray Train patches ``print`` in workers
      (``ray.train.v2._internal.logging.patch_print``); with ``sys.stdout`` wrapped it prints to
      it *and* logs the text, and its console handler writes that to stderr (a logging handler's
      ``emit`` called under ``redirected_print``).
    - A record below WARNING from one of Ray's own loggers (``ray.*``), such as Ray Train's
      "Reporting training result ..." line on every ``ray.train.report``: it would fill the log
      panes and make every worker ship a batch per report. Ray's log files keep these lines.
    """
    frame = sys._getframe(2)
    emitted = False
    for _ in range(24):
        if frame is None:
            return False
        name = frame.f_code.co_name
        if name == "emit":
            record = frame.f_locals.get("record")
            if (isinstance(record, logging.LogRecord) and record.name.startswith("ray.")
                    and record.levelno < logging.WARNING):
                return True
            emitted = True
        elif name == "redirected_print":
            return emitted
        frame = frame.f_back  # type: ignore[assignment]
    return False


class _TeeStream(io.TextIOBase):
    """Writes through to the original stream and collects complete lines for the batch."""

    def __init__(self, original: Any, name: str, tee: _Tee) -> None:
        self._original = original
        self._name = name
        self._tee = tee
        self._partial = ""

    def write(self, text: str) -> int:
        try:
            self._original.write(text)
        except Exception:
            pass
        if text and not (self._name == "stderr" and _not_for_the_panes()):
            lines = (self._partial + text).split("\n")
            self._partial = lines.pop()
            if lines:
                self._tee.add(self._name, lines)
        return len(text)

    def flush(self) -> None:
        try:
            self._original.flush()
        except Exception:
            pass

    def finish(self) -> None:
        if self._partial:
            self._tee.add(self._name, [self._partial])
            self._partial = ""

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._original, "encoding", "utf-8")

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return int(self._original.fileno())


class _Tee:
    """Replaces ``sys.stdout``/``sys.stderr`` while the function runs; ships line batches."""

    def __init__(self, rank: int, queue: Any, interval_s: float, max_lines: int) -> None:
        self._rank = rank
        self._queue = queue
        self._interval_s = interval_s
        self._max_lines = max_lines
        self._lock = threading.Lock()
        self._lines: list[tuple[str, str]] = []
        self._dropped = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="raytpu-log-tee", daemon=True)
        self._saved: tuple[Any, Any] = (sys.stdout, sys.stderr)
        self._streams: list[_TeeStream] = []

    def add(self, stream: str, lines: list[str]) -> None:
        with self._lock:
            self._lines.extend((stream, line) for line in lines)
            extra = len(self._lines) - self._max_lines
            if extra > 0:
                del self._lines[:extra]
                self._dropped += extra

    def start(self) -> None:
        self._saved = (sys.stdout, sys.stderr)
        self._streams = [_TeeStream(sys.stdout, "stdout", self),
                         _TeeStream(sys.stderr, "stderr", self)]
        sys.stdout, sys.stderr = self._streams
        self._thread.start()

    def stop(self) -> None:
        for s in self._streams:
            s.finish()
        if sys.stdout is self._streams[0]:
            sys.stdout = self._saved[0]
        if sys.stderr is self._streams[1]:
            sys.stderr = self._saved[1]
        self._stop.set()
        self._thread.join(timeout=2)
        self._ship()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._ship()

    def _ship(self) -> None:
        with self._lock:
            lines, dropped = self._lines, self._dropped
            self._lines, self._dropped = [], 0
        if lines or dropped:
            batch: LogBatch = {"rank": self._rank, "time": time.time(), "lines": lines,
                               "dropped": dropped}
            _put(self._queue, batch)
