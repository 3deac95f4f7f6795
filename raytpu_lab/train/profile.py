"""Profiling a window of training steps on every worker with ``jax.profiler``.

A **step** is one ``ray.train.report`` call of the worker: step 0 is the work up to and including
the first report, step ``k`` the work after report ``k - 1`` returned up to and including report
``k``. The window ``START:STOP`` (as a Python slice: steps ``START .. STOP - 1``) starts a trace
with ``jax.profiler.start_trace`` when report ``START - 1`` returns (at the very start when
``START`` is 0) and stops it when report ``STOP - 1`` returns. Each traced step is wrapped in
``jax.profiler.StepTraceAnnotation("train", step_num=k)`` (XProf's step markers) and each report
in a ``TraceAnnotation("ray.train.report")``, so time spent waiting for the other ranks shows.

Every worker also keeps, for all its steps, how long it worked before reporting (``busy_s``) and
how long ``ray.train.report`` blocked (``report_s``), and every XLA compilation JAX made (from
``jax.monitoring``'s ``/jax/core/compile/backend_compile_duration`` events, with the function
name). It writes them to ``steps.json`` beside its trace.

Where traces go: ``<run storage>/profile/rank<RRR>-<slice>-w<worker id>/`` (the run's
``ray.train.get_context().get_storage()`` directory, local or ``gs://``), one folder per rank,
each an XProf/TensorBoard log dir (``plugins/profile/<session>/<host>.xplane.pb``). The trace is
written locally first and copied with the storage's own ``pyarrow`` file system, as Ray Train
does for checkpoints.

The window is checked before anything starts (:func:`parse_profile_window`); a window the run
never reached is reported after the run (:mod:`raytpu_lab.train.profile_analysis`).

PyTorch/XLA runs (``tracer="torch_xla"``) trace the same window with ``torch_xla.debug.profiler``
(``start_trace``/``stop_trace``, a ``TraceMe`` step event with ``step_num`` around each step): the same rank
folders, ``steps.json`` and ``.xplane.pb`` files. What that trace holds is what torch_xla's
profiler session records in the worker process: its client-side events (lazy-tensor tracing,
graph compilation and execution, host <-> device transfers) and, on TPUs, the device activity.
On the emulator (PJRT on CPU) there is no device plane, so the window shows host time and XLA's
CPU executions only; and torch_xla reports no per-compile events to us, so ``steps.json`` keeps
no compilation log for torch workers (their compile counts come from the worker summary,
:mod:`raytpu_lab.train.xla_profile`).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from raytpu_lab.advice import opt
from raytpu_lab.errors import TrainingConfigError

__all__ = ["ProfileWindow", "Tracer", "parse_profile_window", "with_profiler", "PROFILE_DIR", "STEPS_FILE",
           "STEP_ANNOTATION", "REPORT_ANNOTATION", "MAX_KEPT_STEPS"]

PROFILE_DIR = "profile"
"""Folder, inside the run's storage directory, holding one trace folder per rank."""
STEPS_FILE = "steps.json"
"""Per-rank step timings and compilation log, beside the rank's trace."""
STEP_ANNOTATION = "train"
"""Name of the ``StepTraceAnnotation`` around each traced step."""
REPORT_ANNOTATION = "ray.train.report"
"""Name of the ``TraceAnnotation`` around each report (waiting for the other ranks)."""
MAX_KEPT_STEPS = 100_000
"""Step timings kept per rank (later steps are counted, not kept)."""
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"

Tracer = Literal["jax", "torch_xla"]
"""Which profiler traces the window in the workers: ``jax.profiler`` or ``torch_xla``'s."""


@dataclass(frozen=True)
class ProfileWindow:
    """Steps ``start .. stop - 1`` to trace (``stop`` excluded, as in a Python slice)."""

    start: int
    stop: int

    def __str__(self) -> str:
        return f"{self.start}:{self.stop}"


def parse_profile_window(value: str | tuple[int, int] | ProfileWindow) -> ProfileWindow:
    """``"START:STOP"`` or ``(start, stop)`` -> :class:`ProfileWindow`.

    Raises:
        TrainingConfigError: Not two integers, a negative start, or ``stop <= start``; raised
            before anything is asked of Ray.
    """
    if isinstance(value, ProfileWindow):
        value = (value.start, value.stop)
    fix = ("Pass ", opt("profile", "START:STOP"), " with 0 <= START < STOP, e.g. ",
           opt("profile", "5:8"), " (or a pair in Python: profile=(5, 8)).")
    why = ("A step is one ray.train.report call of a worker, counted from 0; the trace covers "
           "steps START to STOP - 1.")
    if isinstance(value, str):
        parts = value.strip().split(":")
        try:
            if len(parts) != 2:
                raise ValueError
            start, stop = int(parts[0]), int(parts[1])
        except ValueError:
            raise TrainingConfigError((opt("profile", value), " is not START:STOP."), why=why,
                                      fix=fix) from None
    else:
        try:
            start, stop = value
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, stop)):
                raise ValueError
        except (TypeError, ValueError):
            raise TrainingConfigError(f"profile={value!r} is not a pair of integers (start, stop).",
                                      why=why, fix=fix) from None
    if start < 0 or stop <= start:
        raise TrainingConfigError(
            f"Profile window {start}:{stop} is empty or negative.",
            why=f"{why} STOP must be above START and START at least 0.", fix=fix)
    return ProfileWindow(start, stop)


def with_profiler(train_fn: Callable[..., Any], window: ProfileWindow,
                  tracer: Tracer = "jax") -> Callable[..., Any]:
    """Wrap a Ray Train per-worker function so it traces ``window`` on every worker.

    The wrapper has the same signature as ``train_fn`` (``f(config)`` or ``f()``), so Ray Train
    passes ``train_loop_config`` as before. See the module docstring for what a step is and
    where the traces go.

    Args:
        train_fn: The user's per-worker function; it calls ``ray.train.report``.
        window: Steps to trace.
        tracer: ``"jax"`` (``jax.profiler``) or ``"torch_xla"`` (see the module docstring).

    Returns:
        The wrapped function (picklable by Ray's cloudpickle).
    """

    @functools.wraps(train_fn)  # keeps the signature Ray Train inspects to pass the config
    def run_profiled(*args: Any, **kwargs: Any) -> Any:
        profiler = _StepProfiler(window, _TorchXlaTrace() if tracer == "torch_xla" else _JaxTrace())
        try:
            return train_fn(*args, **kwargs)
        finally:
            profiler.finish()

    return run_profiled


class _StepProfiler:
    """Runs inside one Ray Train worker: counts reports, starts/stops the trace, keeps timings."""

    def __init__(self, window: ProfileWindow, trace: _JaxTrace | _TorchXlaTrace) -> None:
        import ray.train

        from raytpu_lab import _ray_private

        self._trace = trace
        self.window = window
        ctx = ray.train.get_context()
        self.rank = ctx.get_world_rank()
        self.storage = ctx.get_storage()
        self.slice_name = os.environ.get("TPU_NAME", "")
        self.worker_id = os.environ.get("TPU_WORKER_ID", "")
        self.tag = f"rank{self.rank:03d}-{self.slice_name or socket.gethostname()}-w{self.worker_id}"
        self.local_dir = tempfile.mkdtemp(prefix="raytpu-profile-")
        self.step = 0
        self.steps: list[dict[str, float]] = []
        self.compiles: list[dict[str, Any]] = []
        self.tracing = False
        self.traced: list[int] = []
        self.error: str | None = None
        self._step_ctx: Any = None
        self._step_start = time.perf_counter()
        trace.listen(self._on_jax_event)
        self._undo = _ray_private.wrap_train_report(self._around_report)
        if window.start == 0:
            self._start_trace()
        self._enter_step()

    # -- hooks -------------------------------------------------------------------------------

    def _on_jax_event(self, event: str, duration_secs: float, **kwargs: str | int) -> None:
        if event == _COMPILE_EVENT:
            self.compiles.append({"step": self.step, "fun_name": str(kwargs.get("fun_name", "?")),
                                  "duration_s": duration_secs})

    def _around_report(self, report: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        reported = time.perf_counter()
        try:
            if self.tracing:
                with self._trace.annotation(REPORT_ANNOTATION):
                    return report(*args, **kwargs)
            return report(*args, **kwargs)
        finally:
            done = time.perf_counter()
            if len(self.steps) < MAX_KEPT_STEPS:
                self.steps.append({"step": self.step, "busy_s": reported - self._step_start,
                                   "report_s": done - reported})
            self._exit_step()
            self.step += 1
            if self.step == self.window.start:
                self._start_trace()
            elif self.step == self.window.stop:
                self._stop_trace()
            self._step_start = time.perf_counter()
            self._enter_step()

    # -- trace -------------------------------------------------------------------------------

    def _enter_step(self) -> None:
        if self.tracing:
            self._step_ctx = self._trace.step(STEP_ANNOTATION, self.step)
            self._step_ctx.__enter__()
            self.traced.append(self.step)

    def _exit_step(self) -> None:
        if self._step_ctx is not None:
            self._step_ctx.__exit__(None, None, None)
            self._step_ctx = None

    def _start_trace(self) -> None:
        try:
            self._trace.start(self.local_dir)
            self.tracing = True
        except Exception as err:  # a profiler failure must not fail the training run
            self.error = f"start_trace failed: {type(err).__name__}: {err}"

    def _stop_trace(self) -> None:
        if not self.tracing:
            return
        self._exit_step()
        self.tracing = False
        try:
            self._trace.stop()
        except Exception as err:
            self.error = f"stop_trace failed: {type(err).__name__}: {err}"

    def finish(self) -> None:
        """Stop a trace still running (run ended inside the window), write ``steps.json``, copy
        everything to the run's storage, undo the hooks."""
        self._stop_trace()
        self._undo()
        self._trace.unlisten()
        meta = {
            "rank": self.rank, "slice_name": self.slice_name, "worker_id": self.worker_id,
            "hostname": socket.gethostname(), "megascale_slice_id":
                os.environ.get("MEGASCALE_SLICE_ID"), "window": [self.window.start,
                                                                 self.window.stop],
            "reports": self.step, "traced_steps": self.traced, "steps": self.steps,
            "compiles": self.compiles, "error": self.error, "tracer": self._trace.name,
        }
        with open(os.path.join(self.local_dir, STEPS_FILE), "w") as f:
            json.dump(meta, f)
        try:
            _copy_to_storage(self.local_dir, self.storage, f"{PROFILE_DIR}/{self.tag}")
        finally:
            shutil.rmtree(self.local_dir, ignore_errors=True)


class _JaxTrace:
    """``jax.profiler`` in a JAX worker, and JAX's compile events."""

    name: Tracer = "jax"

    def __init__(self) -> None:
        import jax

        self._jax = jax
        self._listeners: list[Callable[..., None]] = []

    def listen(self, on_event: Callable[..., None]) -> None:
        self._listeners.append(on_event)
        self._jax.monitoring.register_event_duration_secs_listener(on_event)

    def unlisten(self) -> None:
        for on_event in self._listeners:
            try:
                self._jax.monitoring.unregister_event_duration_listener(on_event)
            except (AssertionError, ValueError):
                pass
        self._listeners.clear()

    def start(self, local_dir: str) -> None:
        # Python tracing off: it multiplies the trace size by ~10 and XProf's op tables,
        # step breakdown and XLA events come from the host/device tracers.
        options = self._jax.profiler.ProfileOptions()
        options.python_tracer_level = 0
        self._jax.profiler.start_trace(local_dir, profiler_options=options)

    def stop(self) -> None:
        self._jax.profiler.stop_trace()  # type: ignore[no-untyped-call]

    def step(self, name: str, step: int) -> Any:
        return self._jax.profiler.StepTraceAnnotation(name, step_num=step)

    def annotation(self, name: str) -> Any:
        return self._jax.profiler.TraceAnnotation(name)


class _TorchXlaTrace:
    """``torch_xla.debug.profiler`` in a PyTorch/XLA worker (no compile events: see the module
    docstring)."""

    name: Tracer = "torch_xla"

    def __init__(self) -> None:
        import torch_xla
        import torch_xla.debug.profiler as xp

        self._xp = xp
        self._trace_me = torch_xla._XLAC.profiler.TraceMe  # type: ignore[attr-defined, unused-ignore]

    def listen(self, on_event: Callable[..., None]) -> None:
        pass

    def unlisten(self) -> None:
        pass

    def start(self, local_dir: str) -> None:
        self._xp.start_trace(local_dir)

    def stop(self) -> None:
        self._xp.stop_trace()

    def step(self, name: str, step: int) -> Any:
        # A bare TraceMe, not xp.StepTrace or xp.Trace: those also push an IR scope, and the
        # user's torch_xla.sync() inside the step then fails ("Expecting scope to be empty");
        # StepTrace would also sync when the step ends, cutting the user's graph. ``_r=1`` marks
        # a step event at the root level, as StepTrace does, so XProf finds the steps.
        return self._trace_me(name, _r=1, step_num=step)

    def annotation(self, name: str) -> Any:
        return self._trace_me(name)


def _copy_to_storage(local_dir: str, storage: Any, relative: str) -> None:
    """Copy ``local_dir`` to ``<run dir>/<relative>`` on the run's storage file system."""
    import pyarrow.fs

    destination = f"{storage.experiment_fs_path}/{relative}"
    storage.storage_filesystem.create_dir(destination, recursive=True)
    pyarrow.fs.copy_files(local_dir, destination,
                          source_filesystem=pyarrow.fs.LocalFileSystem(),
                          destination_filesystem=storage.storage_filesystem)
