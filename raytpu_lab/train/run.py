"""A running Ray Train run: ``fit()`` in a background thread, a drain thread, stop and wait.

:class:`RunHandle` is what :func:`raytpu_lab.train.launch.start_run` returns, for any trainer.
``fit()`` runs in its own thread so the caller (a notebook cell, a Stop button) stays free; the
drain thread empties the run's two queue actors every ``poll_interval_s`` seconds (reports,
placement, errors and the controller's handle on one; log lines on the other), folds them into
the :class:`~raytpu_lab.train.result.RunResult` (the one accumulator) and hands each batch to
its :class:`RunListener` s (the dashboard) in one call, so listeners redraw at most once per
interval however fast workers report; listeners read the result, not their own copy.

Stopping: Ray Train V2 aborts a run through its controller actor (``TrainController.abort``, what
``fit()``'s own Ctrl-C handler calls); the controller announces its handle through a callback
(:func:`raytpu_lab._ray_private.controller_announcer`), and :meth:`RunHandle.stop` calls abort
from whatever thread it is in.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, cast

import ray
from ray.util.queue import Empty, Queue

from raytpu_lab import _ray_private
from raytpu_lab.errors import TrainingError
from raytpu_lab.state.fetch import fetch_placement_group_states
from raytpu_lab.train.protocols import LogBatch, RestartEvent, RestartRow, RunEvent
from raytpu_lab.train.result import RunResult, RunUpdate

__all__ = ["RunHandle", "RunListener", "RunUpdate", "STOP_TIMEOUT_S", "wait_for_event"]

STOP_TIMEOUT_S = 10.0
_ABORT_GRACE_S = 4.0
_LATE_ABORT_GRACE_S = 0.5
_MUTE_GRACE_S = 10.0
_TRAIN_ACTORS = ("RayTrainWorker", "TrainController")  # Ray Train's actor class names
_LIVE: set[RunHandle] = set()  # runs of this process not yet done (their placement groups)


class RunListener(Protocol):
    """Receives a run's stream; called from the run's drain thread, never concurrently."""

    def on_update(self, update: RunUpdate) -> None:
        """Called every poll interval while the run lives (``update`` may be empty)."""

    def on_end(self, result: RunResult) -> None:
        """Called once after the last update: finished, failed or stopped."""


class RunHandle:
    """A Ray Train run in progress (see the module docstring).

    Callbacks, all from the drain thread: ``on_slices(slice names, placement group ids)`` once
    the run's slices are known; ``on_finish(handle)`` once it ended, before the listeners'
    ``on_end`` (bookkeeping: it may set :attr:`failure`); ``listeners`` get every update.

    Attributes:
        name: Run name.
        result: The run's :class:`RunResult`, filled while it runs; final once :attr:`done`.
        failure: An error found around the run rather than in it (e.g. it did not land on the
            reservation it was lent, see :mod:`raytpu_lab.reservations.loans`); set before
            :attr:`done`, raised by :meth:`wait`.
    """

    def __init__(self, name: str, result: RunResult, fit: Callable[[], Any], events: Queue,
                 logs: Queue, *, listeners: Sequence[RunListener] = (),
                 on_slices: Callable[[list[str], list[str]], None] | None = None,
                 on_finish: Callable[[RunHandle], None] | None = None,
                 find_slices: Callable[[set[str]], tuple[list[str], list[str]]] | None,
                 poll_interval_s: float, mute_driver_logs: bool,
                 error_text: Callable[[BaseException], str],
                 known_pgs: set[str] | None = None, fail_fast: bool = True) -> None:
        self.name = name
        self.result = result
        self._fit, self._events, self._logs = fit, events, logs
        self._listeners = list(listeners)
        self._on_slices, self._on_finish, self._find_slices = on_slices, on_finish, find_slices
        self._poll_interval_s, self._mute = poll_interval_s, mute_driver_logs
        self._error_text = error_text
        self._controller: Any = None
        self._pg_ids: list[str] = []
        self._known_pgs = set(known_pgs or ())
        self._pids: set[str] = set()
        self._job_id = _job_id()
        self._stop_requested, self._fit_done, self._done = (threading.Event() for _ in range(3))
        self._failing = threading.Event()  # a rank raised: the run is being ended by us
        self._stop_lock = threading.Lock()
        self._aborted = False  # the controller was asked to abort (or killed)
        self._start, self._start_epoch = time.monotonic(), time.time()
        self.result.launched_at = self._start_epoch  # the workers' timestamps are epoch seconds
        self._fail_fast_on = fail_fast  # off with a restart budget: Ray Train restarts instead
        self._attempt, self._refind_slices = 0, False  # restarts so far; find slices again
        self.listener_error: str | None = None
        self.failure: Exception | None = None
        self._fit_thread = threading.Thread(target=self._run_fit, name=f"raytpu-fit-{name}",
                                            daemon=True)
        self._drain_thread = threading.Thread(target=self._drain_loop,
                                              name=f"raytpu-drain-{name}", daemon=True)

    # -- public ----------------------------------------------------------------------------

    def start(self) -> RunHandle:
        """Start ``fit()`` and the drain thread; returns at once."""
        _LIVE.add(self)
        self._drain_thread.start()
        self._fit_thread.start()
        return self

    @property
    def done(self) -> bool:
        """The run ended (finished, failed or stopped) and its last update was delivered."""
        return self._done.is_set()

    @property
    def elapsed_s(self) -> float:
        """Seconds since launch (wall time of the run once done)."""
        return self.result.wall_s if self.done else time.monotonic() - self._start

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> bool:
        """Abort the run and wait until Ray Train has ended it and freed its slices.

        Safe from any thread (a button callback, a signal handler's caller) and idempotent.

        Args:
            timeout_s: Seconds to wait in all: for the controller to announce itself (a run still
                starting), to abort, and for the run's placement groups to go.

        Returns:
            Whether the run ended and its placement groups were removed within ``timeout_s``.
        """
        self._stop_requested.set()
        return self._abort(timeout_s)

    def _abort(self, timeout_s: float, grace_s: float = _ABORT_GRACE_S) -> bool:
        """Abort through Ray Train's controller (killed if it has not aborted within ``grace_s``
        seconds), wait for ``fit()`` to end and the placement groups to go (as :meth:`stop`,
        whose flag the caller sets or not)."""
        deadline = time.monotonic() + timeout_s
        with self._stop_lock:
            while not self._fit_done.is_set():
                controller = self._controller
                if controller is not None and self._aborted:
                    break  # another thread's abort got there first
                if controller is not None:
                    self._aborted = True
                    _ray_private.abort_train_controller(
                        controller,
                        timeout_s=max(0.5, min(grace_s, deadline - time.monotonic() - 4)))
                    break
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.05)
        self._fit_done.wait(max(0.0, deadline - time.monotonic()))
        self._remove_orphan_pgs()
        self._done.wait(max(0.0, deadline - time.monotonic()))
        while _live(self._pg_ids) and time.monotonic() < deadline:
            time.sleep(0.1)
        return self._fit_done.is_set() and not _live(self._pg_ids)

    def _fail_fast(self) -> None:
        """A rank raised (the worker tap said so): end the run now.

        Left alone, Ray Train notices at its next poll of the workers, then shuts the worker
        group down gracefully: each worker's shutdown hooks and ``jax.distributed.shutdown``
        (up to 30 s, ``JAX_DISTRIBUTED_SHUTDOWN_TIMEOUT_S``), while ranks still blocked in a
        collective with the failed one wait for it; a failure took over a minute to end the
        cell. No retry is lost: only runs with ``max_failures=0`` do this (a run with a restart
        budget is left to Ray Train, which restarts it), and those fail anyway. The abort runs in its own thread (the drain thread keeps delivering updates meanwhile)."""
        self._failing.set()
        threading.Thread(target=self._abort, args=(STOP_TIMEOUT_S,),
                         name=f"raytpu-fail-{self.name}", daemon=True).start()

    def _remove_orphan_pgs(self) -> None:
        others = {pg for h in list(_LIVE) if h is not self for pg in h._pg_ids}
        removed = _remove_orphans(self._known_pgs | others)
        self._pg_ids = sorted(set(self._pg_ids) | set(removed))

    def wait(self, timeout_s: float | None = None) -> RunResult:
        """Block until the run ends; Ctrl-C (KeyboardInterrupt) stops the run, then re-raises.

        Returns:
            The result (also of a stopped run).

        Raises:
            TrainingError: The workers raised (the slices are already freed).
            TimeoutError: ``timeout_s`` passed first (the run goes on).
            KeyboardInterrupt: Interrupted; the run was stopped first.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with _ctrl_c_raises():
            try:
                while not self._done.wait(0.1):
                    if deadline is not None and time.monotonic() >= deadline:
                        raise TimeoutError(f"run {self.name!r} still running after {timeout_s} s")
            except KeyboardInterrupt:
                self.stop()
                raise
        return self._outcome()

    async def wait_async(self) -> RunResult:
        """:meth:`wait` for an event loop (an async notebook cell); cancelling stops the run."""
        await wait_for_event(self._done, on_cancel=self.stop)
        return self._outcome()

    def __repr__(self) -> str:
        state = "running" if not self.done else repr(self.result)
        return f"RunHandle({self.name!r}, {state})"

    # -- threads ---------------------------------------------------------------------------

    def _outcome(self) -> RunResult:
        r = self.result
        if self.failure is not None and r.error is None:
            raise self.failure
        if r.error is not None:
            raise TrainingError(
                f"Training run {self.name!r} failed on its workers.", why=r.error,
                fix="Fix the training function and run the cell again; the slices were freed.",
                run_name=self.name, worker_error=r.error)
        return r

    def _run_fit(self) -> None:
        try:
            ray_result = self._fit()
            self.result.ray_result = ray_result
            self.result.storage_path = getattr(ray_result, "path", "") or ""
            error = getattr(ray_result, "error", None)
            if error is not None and not self._stop_requested.is_set():
                self.result.error = self._error_text(error)
        except ray.exceptions.RayActorError as err:
            # abort() exits the controller actor, so fit()'s ray.get of its run() ends here.
            if self._failing.is_set():
                self.result.error = "a worker raised"  # replaced by its traceback at the end
            elif not self._stop_requested.is_set():
                self.result.error = f"Ray Train's controller died: {err}"
        except BaseException as err:  # noqa: BLE001 - recorded, raised in the caller's thread
            if not self._stop_requested.is_set():
                self.result.error = self._error_text(err)
            # Keep only text: a kept exception (traceback) keeps Ray Train's controller alive.
        finally:
            if self._failing.is_set() and not self._stop_requested.is_set() \
                    and self.result.error is None:
                self.result.error = "a worker raised"
            self.result.stopped = self._stop_requested.is_set()
            self.result.wall_s = time.monotonic() - self._start
            self._fit_done.set()

    def _drain_loop(self) -> None:
        mute = _ray_private.muted_worker_logs(
            functools.partial(_is_runs_log, self._pids, self._job_id)) if self._mute else None
        try:
            if mute is not None:
                mute.__enter__()
            while True:
                finished = self._fit_done.is_set()
                self._drain_once()
                if finished:
                    break
                self._fit_done.wait(self._poll_interval_s)
        finally:
            for q in (self._events, self._logs):
                _shutdown_queue(q)
            self.result.lead_with_worker_error()
            if self._on_finish is not None:
                try:
                    self._on_finish(self)
                except Exception as err:  # e.g. a profile that cannot be read: the run is done
                    self.listener_error = f"{type(err).__name__}: {err}"
            for listener in self._listeners:
                try:
                    listener.on_end(self.result)
                except Exception as err:  # the run's result must not depend on its view
                    self.listener_error = f"{type(err).__name__}: {err}"
            self._done.set()
            _LIVE.discard(self)
            if mute is not None:  # Ray forwards log lines a second or two late: keep muting
                unmute = threading.Timer(_MUTE_GRACE_S, mute.__exit__, (None, None, None))
                unmute.daemon = True
                unmute.start()

    def _drain_once(self) -> None:
        update = RunUpdate(elapsed_s=time.monotonic() - self._start)
        for event in _take_all(self._events):
            self._take_event(event, update)
        for batch in _take_all(self._logs):
            _take_logs(batch, update)
        r = self.result
        if update.errors and self._fail_fast_on and not self._failing.is_set() \
                and not self._stop_requested.is_set() and not self._fit_done.is_set():
            self._fail_fast()
        if self._find_slices is not None and (not r.slice_names or self._refind_slices):
            try:
                slices, pg_ids = self._find_slices(self._known_pgs)
            except Exception:  # a failed state read is retried on the next poll
                slices, pg_ids = [], []
            if slices:
                self._pg_ids, self._refind_slices = pg_ids, False
                update.slices = slices
                update.placed_s = update.elapsed_s
                if self._on_slices is not None:
                    self._on_slices(slices, self._pg_ids)
        update.slices = update.slices or list(r.slice_names)
        r.absorb(update)
        for listener in self._listeners:
            try:
                listener.on_update(update)
            except Exception as err:
                self.listener_error = f"{type(err).__name__}: {err}"

    def _take_event(self, event: RunEvent, update: RunUpdate) -> None:
        """Sort one item of the events queue into ``update`` (and keep the controller)."""
        if event["kind"] == "reports":
            if self._attempt:
                for record in event["rows"]:
                    record["attempt"] = self._attempt
            update.records.extend(event["rows"])
        elif event["kind"] == "restart":  # the old group's placement groups are Ray Train's
            self._attempt += 1
            self._known_pgs |= set(self._pg_ids)
            self._refind_slices = True  # the new group's slices are looked for again
            update.restarts.append(_restart_row(event, self._start_epoch))
        elif event["kind"] == "controller":
            self._controller = event["handle"]
            self._pids.add(str(event["pid"]))
            if (self._stop_requested.is_set() or self._failing.is_set()) and not self._aborted:
                # Stopped while Ray Train was still starting, and the controller came after the
                # stop had given up waiting for it (seen: a Stop 2 s into a run whose controller
                # announced itself 12 s in): carry the stop out now, or the run would go on.
                # A controller that just announced itself is starting its worker group and
                # serves no call until that is done, so it gets a short grace before the kill.
                threading.Thread(target=self._abort, args=(STOP_TIMEOUT_S, _LATE_ABORT_GRACE_S),
                                 name=f"raytpu-late-stop-{self.name}", daemon=True).start()
        elif event["kind"] == "tap":
            for row in event["rows"]:
                if row["kind"] == "placement":
                    if self._attempt:
                        cast(dict[str, Any], row)["attempt"] = self._attempt
                    update.workers.append(row)
                    self._pids.add(str(row["pid"]))
                elif row["kind"] == "error":
                    update.errors.append(row)
                elif row["kind"] == "timing":
                    update.timings.append(row)
                elif row["kind"] == "summary":
                    self.result.worker_summaries[int(row["rank"])] = dict(row["summary"])


def _is_runs_log(pids: set[str], job_id: str | None, batch: dict[str, Any]) -> bool:
    """A log batch Ray would print for this run: its workers' or controller's pids, or, since
    a worker can print (and fail) before its placement row reaches us, any Ray Train
    worker or controller of this job while the run lives. Also the autoscaler's "No
    available node types can fulfill placement group requests" while a slice is being
    placed: on the emulator (no autoscaler) and while a reservation's other slices are
    fenced (pending on purpose) it only misleads; a run that cannot be placed says so itself."""
    if str(batch.get("pid")) in pids:
        return True
    if batch.get("pid") == "autoscaler":
        return any(_UNPLACEABLE in str(line) for line in batch.get("lines") or [])
    return (batch.get("job") == job_id
            and str(batch.get("actor_name") or "").startswith(_TRAIN_ACTORS))


def _job_id() -> str | None:
    """This driver's Ray job id (Ray's log batches carry it), ``None`` when not connected."""
    try:
        return str(ray.get_runtime_context().get_job_id())
    except Exception:
        return None


def _restart_row(event: RestartEvent, start_epoch: float) -> RestartRow:
    """A restart event as the result keeps it (seconds since launch, from epoch seconds)."""
    return {"at_s": float(event["time"]) - start_epoch, "state": str(event["state"]),
            "errors": {int(k): str(v) for k, v in event["errors"].items()},
            "error": str(event["error"])}


_UNPLACEABLE = "No available node types can fulfill placement group requests"


def _remove_orphans(others: set[str]) -> list[str]:
    """After a kill mid-start: remove the unnamed placement groups Ray Train made for a run (not
    in ``others``: those that existed at its launch or belong to another live run of this
    kernel); returns their ids."""
    try:
        table = fetch_placement_group_states()
    except Exception:
        return []
    mine = [pg for pg, info in table.items()
            if pg not in others and info["state"] != "REMOVED" and not info["name"]]
    for pg in mine:
        try:
            _ray_private.remove_placement_group_by_id(pg)
        except Exception:  # gone meanwhile
            continue
    return mine


def _live(pg_ids: list[str]) -> list[str]:
    """Which of ``pg_ids`` still exist (``[]`` when Ray cannot be read)."""
    if not pg_ids:
        return []
    try:
        table = fetch_placement_group_states()
    except Exception:
        return []
    return [pg for pg in pg_ids if pg in table and table[pg]["state"] not in ("", "REMOVED")]


async def wait_for_event(event: threading.Event, *, on_cancel: Callable[[], Any],
                         poll_s: float = 0.1) -> None:
    """Await ``event`` without blocking the event loop (polled every ``poll_s`` seconds); when the
    await is cancelled (a kernel interrupt of an awaited cell), run ``on_cancel`` (e.g. stop the
    run, which may block) in a worker thread, then re-raise ``CancelledError``."""
    try:
        while not event.is_set():
            await asyncio.sleep(poll_s)
    except asyncio.CancelledError:
        await asyncio.get_running_loop().run_in_executor(None, on_cancel)
        raise


@contextlib.contextmanager
def _ctrl_c_raises() -> Iterator[None]:
    """In the main thread: SIGINT raises ``KeyboardInterrupt`` while the block runs.

    A ``fit()`` called in the main thread leaves Ray Train's SIGINT handler installed
    (``DataParallelTrainer._register_sigint_handler``), bound to that run's controller; a later
    Ctrl-C would then abort the dead controller and end the process with ``SystemExit`` instead of
    stopping our run. The previous handler is put back afterwards.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:  # None: a handler set outside Python, which cannot be put back from here
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)


def _take_logs(batch: LogBatch, update: RunUpdate) -> None:
    """One worker's log batch into ``update``."""
    rank = int(batch["rank"])
    update.logs.extend((rank, str(s), str(t)) for s, t in batch.get("lines", []))
    update.log_times[rank] = float(batch.get("time", 0.0))
    if batch.get("dropped"):
        update.dropped[rank] = update.dropped.get(rank, 0) + int(batch["dropped"])


def _take_all(queue: Queue) -> list[Any]:
    try:
        size = queue.qsize()
        return list(queue.get_nowait_batch(size)) if size else []
    except (Empty, ray.exceptions.RayError):
        return []


def _shutdown_queue(queue: Queue) -> None:
    try:
        queue.shutdown(force=True)
    except Exception:  # the cluster may be gone already; the actor dies with it
        pass
