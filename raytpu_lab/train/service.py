"""One run path for every trainer: check a :class:`~raytpu_lab.train.spec.RunSpec`, find its slices
(idle ones, or a reservation's on loan), start it with its trainer's factory, keep the books.

:class:`Runs` is what the session (:class:`raytpu_lab.lab.Lab`) delegates training to. It takes
everything it needs from the session as parameters, so a test can build one around a fake state
reader:

- ``snapshot()``: the cluster snapshot (which slices are idle, where the run landed);
- ``require_connection(doing)``: raises :class:`~raytpu_lab.errors.NotConnectedError`;
- ``reservation(name)``: the session's reservation of that name (raises
  :class:`~raytpu_lab.errors.ReservationError` when there is none), ``held()``: the names of all
  of them, and ``release_hosts(name)``: close its per-host processes before its chips are lent;
- ``on_placed(label, slice_names, pg_ids, num_slices)`` once a run's slices are known, and
  ``on_ended(label)`` when it ended (the session's map highlight and job labels).

:data:`TRAINERS` maps a trainer kind to the function that builds and starts its Ray Train trainer
(:func:`raytpu_lab.train.launch.start_jax`, :func:`raytpu_lab.train.torch_run.start_torch`), all
through :func:`raytpu_lab.train.launch.start_run`, so every trainer gets the same stream, Stop,
reservation and profiling.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from typing import Any, Protocol

from raytpu_lab._protocols import RawState
from raytpu_lab.advice import cmd, opt
from raytpu_lab.errors import NoSliceAvailableError, ReservationError, TrainingConfigError
from raytpu_lab.reservations.loans import SliceLoan
from raytpu_lab.reservations.slices import Reservation, diagnose
from raytpu_lab.state.fetch import fetch_raw_state
from raytpu_lab.state.snapshot import ClusterSnapshot
from raytpu_lab.tpu.topology import SliceShape
from raytpu_lab.train.board import RunBoard
from raytpu_lab.train.launch import start_jax
from raytpu_lab.train.profile import ProfileWindow
from raytpu_lab.train.profile_analysis import ProfileReport
from raytpu_lab.train.profile_load import load_profile
from raytpu_lab.train.protocols import Record
from raytpu_lab.train.result import RunResult, RunUpdate
from raytpu_lab.train.run import RunHandle, RunListener
from raytpu_lab.train.spec import CheckedRun, RunSpec, TrainerKind, validate
from raytpu_lab.train.torch_run import is_emulated, start_torch

__all__ = ["Runs", "TRAINERS", "TrainerFactory"]


class TrainerFactory(Protocol):
    """Starts a checked run under its Ray Train trainer: ``factory(run, name, snapshot=...,
    **start_run_options)`` (options as :func:`~raytpu_lab.train.launch.start_run` takes them)."""

    def __call__(self, run: CheckedRun, name: str, *, snapshot: Callable[[], ClusterSnapshot],
                 **kwargs: Any) -> RunHandle: ...


def _start_jax(run: CheckedRun, name: str, *, snapshot: Callable[[], ClusterSnapshot],
               **kwargs: Any) -> RunHandle:
    assert run.spec.train_fn is not None
    return start_jax(run.spec.train_fn, run.shape, name=name, num_slices=run.spec.slices,
                     config=run.config, storage_path=run.spec.storage_path, profile=run.window,
                     max_failures=run.spec.max_failures, snapshot=snapshot, **kwargs)


def _start_torch(run: CheckedRun, name: str, *, snapshot: Callable[[], ClusterSnapshot],
                 **kwargs: Any) -> RunHandle:
    s = run.spec
    assert s.train_fn is not None
    return start_torch(s.train_fn, run.shape, name=name, num_slices=s.slices, config=run.config,
                       backend=s.backend, chips_per_worker=s.chips_per_worker,
                       emulated=is_emulated(snapshot(), run.shape), storage_path=s.storage_path,
                       profile=run.window, max_failures=s.max_failures, snapshot=snapshot,
                       **kwargs)


TRAINERS: dict[TrainerKind, TrainerFactory] = {"jax": _start_jax, "torch": _start_torch}
"""Trainer kind -> the factory that starts its runs."""


class _OnRecords:
    """The public ``on_records(records)`` callback as a run listener."""

    def __init__(self, on_records: Callable[[list[Record]], None]) -> None:
        self._on_records = on_records

    def on_update(self, update: RunUpdate) -> None:
        if update.records:
            self._on_records(update.records)

    def on_end(self, result: RunResult) -> None:
        pass


class Runs:
    """Starts training runs and keeps the last one's result (see the module docstring).

    Attributes:
        last_run: The most recent run's result (set when it ends).
        last_profile: The analysis of the most recent profiled run, or ``None``.
    """

    def __init__(self, snapshot: Callable[[], ClusterSnapshot],
                 require_connection: Callable[[str], None], *,
                 reservation: Callable[[str], Reservation],
                 held: Callable[[], Collection[str]],
                 release_hosts: Callable[[str], None],
                 on_placed: Callable[[str, list[str], list[str], int], None],
                 on_ended: Callable[[str], None],
                 raw_state: Callable[[], RawState] = fetch_raw_state,
                 trainers: dict[TrainerKind, TrainerFactory] | None = None) -> None:
        self._snapshot = snapshot
        self._require_connection = require_connection
        self._reservation = reservation
        self._held = held
        self._release_hosts = release_hosts
        self._on_placed = on_placed
        self._on_ended = on_ended
        self._raw_state = raw_state
        self._trainers = TRAINERS if trainers is None else trainers
        self.last_run: RunResult | None = None
        self.last_profile: ProfileReport | None = None

    def start(self, spec: RunSpec, *, on_launch: Callable[[], None] | None = None,
              on_records: Callable[[list[Record]], None] | None = None,
              listener: RunListener | None = None,
              mute_driver_logs: bool = False) -> RunHandle:
        """Check ``spec``, wait for its slices, start it; return its handle at once.

        With ``spec.reservation``, the run is lent that reservation's slices (a
        :class:`~raytpu_lab.reservations.loans.SliceLoan`): it lands there or is aborted, and
        the reservation takes its slices back when the run ends. Else it waits up to
        ``spec.wait_s`` for enough idle slices.

        Args:
            spec: The run; its ``train_fn`` must be set.
            on_launch: Called once the slices are there, just before the trainer starts.
            on_records: Called from the drain thread with each batch of new records.
            listener: Gets every update and the end of the run (e.g. a ``RunDashboard``).
            mute_driver_logs: Keep Ray from also printing the workers' output here.

        Raises:
            InvalidTopologyError, RaytpuError, TrainingConfigError: See
                :func:`~raytpu_lab.train.spec.validate` (nothing contacted).
            NotConnectedError: No cluster connected.
            ReservationError: The reservation is unknown or its slices do not match.
            NoSliceAvailableError: Not enough intact idle slices within ``spec.wait_s``.
        """
        run = validate(spec)
        if spec.train_fn is None:
            raise TrainingConfigError("A run needs its training function; only check_* take "
                                      "None.")
        name = run.run_name()
        self._require_connection(f"launch run {name!r}")
        self.last_profile = None
        loan = self._loan(spec.reservation, run.shape, spec.slices, spec.wait_s) \
            if spec.reservation is not None else None
        if loan is None:
            self._wait_for_idle(run.shape, spec.slices, spec.wait_s)
        if on_launch is not None:
            on_launch()
        label = f"run {name}"
        window = run.window

        def placed(slice_names: list[str], pg_ids: list[str]) -> None:
            self._on_placed(label, slice_names, pg_ids, spec.slices)

        def finished(handle: RunHandle) -> None:
            self._on_ended(label)
            self.last_run = handle.result
            if loan is not None:
                handle.failure = loan.end()
            if window is not None:
                self._load_profile(handle.result, window)

        box: list[RunHandle] = []
        abort_wanted = threading.Event()

        def abort() -> None:
            # Never block the loan's watcher on stop(): stop waits for the end, which ends the loan.
            abort_wanted.set()
            if box:
                threading.Thread(target=box[0].stop, daemon=True).start()

        if loan is not None:
            loan.begin(abort=abort)
        board = RunBoard(name, spec.trainer)  # listed and stoppable from the Lab sidebar
        listeners = [x for x in (_OnRecords(on_records) if on_records else None, listener, board)
                     if x is not None]
        try:
            handle = self._trainers[spec.trainer](
                run, name, snapshot=self._snapshot, on_placement=placed, on_finish=finished,
                listeners=listeners, mute_driver_logs=mute_driver_logs)
        except BaseException:
            if loan is not None:
                loan.end()
            raise
        box.append(handle)
        board.attach(handle)
        if abort_wanted.is_set():  # the loan gave up before the handle existed
            threading.Thread(target=handle.stop, daemon=True).start()
        return handle

    def _load_profile(self, result: RunResult, window: ProfileWindow) -> None:
        """After a profiled run: analyse its traces into :attr:`last_profile`."""
        self.last_profile = load_profile(result.storage_path, (window.start, window.stop))

    def _loan(self, name: str, shape: SliceShape, slices: int, wait_s: float) -> SliceLoan:
        """Reservation ``name``'s slices, to lend to a Ray Train run of ``slices`` x ``shape``."""
        res = self._reservation(name)
        if (res.shape.pod_type, res.shape.topology, len(res.slice_names)) != (
                shape.pod_type, shape.topology, slices):
            raise ReservationError(
                f"Reservation {name!r} holds {len(res.slice_names)} x {res.shape.pod_type} "
                f"({res.shape.topology}), not {slices} x {shape.pod_type} ({shape.topology}).",
                fix=("Use ", opt("topology", res.shape.topology), " ",
                     opt("version", res.shape.version), " ", opt("slices", len(res.slice_names)),
                     ", or leave them out with ", opt("reservation"), "."))
        self._release_hosts(name)  # its host processes hold the chips the run needs
        return SliceLoan(res, self._snapshot, self._raw_state, wait_s=wait_s)

    def _wait_for_idle(self, shape: SliceShape, slices: int, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while True:
            snap = self._snapshot()
            intact = [s for s in snap.slices_of(shape.pod_type) if s.health == "intact"]
            if len(intact) < slices:
                raise diagnose(snap, shape, slices, timeout_s=0.0, impossible=True)
            if len(snap.idle_slices(shape.pod_type)) >= slices:
                return
            own = set(self._held())
            usable = [s for s in intact if not set(s.owners) <= own or not s.owners]
            if len(usable) < slices:
                taken = ", ".join(f"{s.name} (your reservation {'/'.join(s.owners)})"
                                  for s in intact if s.owners and set(s.owners) <= own)
                raise NoSliceAvailableError(
                    f"Cannot launch on {slices} slice(s) of {shape.pod_type}: this session holds "
                    f"them: {taken}.",
                    why="JaxTrainer reserves its own slices; Ray Train does not accept a "
                        "placement group or label selector together with use_tpu.",
                    fix=("Release the reservation first (", cmd("release", "NAME"), ")."),
                    pod_type=shape.pod_type, slices_needed=slices)
            if time.monotonic() >= deadline:
                raise diagnose(snap, shape, slices, timeout_s=wait_s, wait_option="wait")
            time.sleep(0.5)
