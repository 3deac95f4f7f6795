"""The session's training methods: each builds a :class:`~raytpu_lab.train.spec.RunSpec` and hands it
to the session's run service (:class:`raytpu_lab.train.service.Runs`, ``self.runs``), the one run
path of every trainer. Kept apart from :class:`raytpu_lab.lab.Session` only for size: the
signatures and docstrings are the public API notebooks use (``lab.train_jax(...)``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from raytpu_lab.session._forward import forwarded
from raytpu_lab.tpu.topology import SliceShape
from raytpu_lab.train.profile_analysis import ProfileReport
from raytpu_lab.train.result import RunResult
from raytpu_lab.train.run import RunHandle, RunListener
from raytpu_lab.train.service import Runs
from raytpu_lab.train.spec import RunSpec, max_failures_of, validate
from raytpu_lab.train.torch_run import TorchRunResult

__all__ = ["TrainingMethods"]


class TrainingMethods:
    """Mixed into :class:`~raytpu_lab.lab.Session`: ``train_jax``/``start_jax``/``check_jax`` and the
    same for torch, over ``self.runs``."""

    runs: Runs

    last_run: RunResult | None = forwarded("runs", "last_run",
                                           "The most recent training run's result.")
    last_profile: ProfileReport | None = forwarded(
        "runs", "last_profile",
        "The analysis of the most recent profiled run (``train_jax(profile=...)``).")

    def train_jax(self, train_fn: Callable[..., Any], topology: str, version: str, *,
                  slices: int = 1, name: str | None = None, config: dict[str, Any] | None = None,
                  storage_path: str | None = None, wait_s: float = 60.0,
                  on_launch: Callable[[], None] | None = None,
                  on_records: Callable[[list[dict[str, Any]]], None] | None = None,
                  reservation: str | None = None,
                  profile: str | tuple[int, int] | None = None,
                  max_failures: int = 0, failure_config: Any = None) -> RunResult:
        """Train with Ray Train's ``JaxTrainer`` on ``slices`` whole slices (one worker per host);
        block until the run ends. :meth:`start_jax` without waiting; Ctrl-C stops the run.

        With ``reservation``, the run goes on exactly that reservation's slices or fails with
        :class:`ReservationError` (see :mod:`raytpu_lab.reservations.loans`: Ray Train picks
        its slice itself, so the other slices' heads are fenced while it picks, and the
        reservation takes its slices back when the run ends).

        Args:
            train_fn: Per-worker function ``f(config)`` or ``f()``; calls ``ray.train.report``.
            topology: e.g. ``"4x4"``.
            version: e.g. ``"v6e"``.
            slices: Slices (multi-slice when > 1).
            name: Run name; ``jax-<time>`` if omitted.
            config: Passed to ``train_fn``.
            storage_path: Ray Train storage for checkpoints and results.
            wait_s: Seconds to wait for enough idle slices before launching (with
                ``reservation``: for the run to land on the reserved slices).
            on_launch: Called once checks pass, just before the run starts (e.g. show a chart).
            on_records: Live callback with each batch of reported records.
            reservation: Run on this reservation of the session (shape and slice count must
                match it).
            profile: ``(start, stop)`` or ``"START:STOP"``: trace steps ``start .. stop - 1`` (a
                step is one ``ray.train.report`` call of a worker) with ``jax.profiler`` on every
                worker (:mod:`raytpu_lab.train.profile`); the analysis is left in
                :attr:`last_profile`.
            max_failures: Restarts Ray Train may make when the worker group fails (a rank
                raised, a host died): ``FailureConfig(max_failures=...)``; -1: no limit. Each
                restart lands on slices Ray picks again, with fresh ``MEGASCALE_*`` values;
                the result's ``attempts`` lists them (host, slice, seconds lost).
            failure_config: Ray Train's ``FailureConfig`` instead of ``max_failures``.

        Raises:
            InvalidTopologyError: Bad topology (before Ray is asked).
            TrainingConfigError: Bad config, a bad ``max_failures`` or a function Ray Train
                cannot call (before launch).
            ReservationError: ``reservation`` is unknown or does not match, or the run did not
                land on it (aborted).
            NotConnectedError: No cluster connected.
            NoSliceAvailableError: Not enough intact idle slices within ``wait_s``.
            TrainingError: The workers raised (the slices are freed); names rank, host, traceback.
            KeyboardInterrupt: Interrupted; the run was stopped and its slices freed first.
        """
        return self.start_jax(train_fn, topology, version, slices=slices, name=name,
                              config=config, storage_path=storage_path, wait_s=wait_s,
                              on_launch=on_launch, on_records=on_records,
                              reservation=reservation, profile=profile,
                              max_failures=max_failures, failure_config=failure_config).wait()

    def start_jax(self, train_fn: Callable[..., Any], topology: str, version: str, *,
                  slices: int = 1, name: str | None = None, config: dict[str, Any] | None = None,
                  storage_path: str | None = None, wait_s: float = 60.0,
                  on_launch: Callable[[], None] | None = None,
                  on_records: Callable[[list[dict[str, Any]]], None] | None = None,
                  listener: RunListener | None = None, mute_driver_logs: bool = False,
                  reservation: str | None = None,
                  profile: str | tuple[int, int] | None = None,
                  max_failures: int = 0, failure_config: Any = None) -> RunHandle:
        """Start a ``JaxTrainer`` run (as :meth:`train_jax`) and return its handle at once.

        ``handle.wait()`` blocks for the :class:`RunResult`, ``handle.stop()`` aborts the run and
        frees its slices (within 10 s), ``handle.result`` fills while it runs. ``listener`` (e.g.
        a :class:`~raytpu_lab.widgets.run_dashboard.RunDashboard`) gets every update;
        ``mute_driver_logs`` keeps Ray from also printing the workers' output in this kernel.

        Raises:
            The errors of :meth:`train_jax` raised before launch; worker errors come from
            ``handle.wait()``.
        """
        spec = RunSpec("jax", topology, version, train_fn, slices=slices, name=name,
                       config=config, reservation=reservation, profile=profile,
                       storage_path=storage_path, wait_s=wait_s,
                       max_failures=max_failures_of(max_failures, failure_config))
        return self.runs.start(spec, on_launch=on_launch, on_records=on_records,
                               listener=listener, mute_driver_logs=mute_driver_logs)

    def check_jax(self, train_fn: Callable[..., Any] | None, topology: str, version: str, *,
                  slices: int = 1, config: Any = None,
                  profile: str | tuple[int, int] | None = None) -> SliceShape:
        """Every check of a ``JaxTrainer`` run that needs no cluster, as :meth:`start_jax` makes
        them first: the slice shape, ``slices``, the profile window, the config and the
        function's signature. Contacts nothing and starts nothing
        (:func:`raytpu_lab.train.spec.validate`).

        Args:
            train_fn: The per-worker function, or ``None`` to check everything else (a cell
                magic checks the shape before running the cell that defines the function).
            topology, version, slices, config, profile: As :meth:`train_jax`.

        Returns:
            The slice shape.

        Raises:
            InvalidTopologyError: Bad generation or topology (``.nearest``: valid ones nearby).
            RaytpuError: ``slices`` is not above 0.
            TrainingConfigError: A bad profile window or config, a function Ray Train cannot
                call, or one that reads a name defined nowhere (it would raise NameError on
                every worker, see :func:`~raytpu_lab.train.worker_tap.check_names`).
        """
        return validate(RunSpec("jax", topology, version, train_fn, slices=slices,
                                config=config, profile=profile)).shape

    def check_torch(self, train_fn: Callable[..., Any] | None, topology: str, version: str, *,
                    slices: int = 1, config: Any = None, backend: str | None = None,
                    chips_per_worker: int = 1,
                    profile: str | tuple[int, int] | None = None) -> SliceShape:
        """Every check of a ``TorchTrainer`` run that needs no cluster, as :meth:`start_torch`
        makes them first (see :meth:`check_jax`; also torch/torch_xla installed and matched,
        the backend name and chips per worker). Contacts nothing and starts nothing.

        Raises:
            InvalidTopologyError: Bad generation or topology.
            RaytpuError: ``slices`` is not above 0.
            TrainingConfigError: torch/torch_xla missing or mismatched, a bad backend, chips per
                worker not dividing a host's chips, a bad profile window, config or function
                signature.
        """
        return validate(RunSpec("torch", topology, version, train_fn, slices=slices,
                                config=config, profile=profile, backend=backend,
                                chips_per_worker=chips_per_worker)).shape

    def train_torch(self, train_fn: Callable[..., Any], topology: str, version: str, *,
                    slices: int = 1, name: str | None = None,
                    config: dict[str, Any] | None = None, backend: str | None = None,
                    chips_per_worker: int = 1, storage_path: str | None = None,
                    wait_s: float = 60.0, on_launch: Callable[[], None] | None = None,
                    on_records: Callable[[list[dict[str, Any]]], None] | None = None,
                    reservation: str | None = None,
                    profile: str | tuple[int, int] | None = None,
                    max_failures: int = 0, failure_config: Any = None) -> TorchRunResult:
        """Train with Ray Train's ``TorchTrainer`` on every chip of ``slices`` slices (PyTorch/XLA);
        block until the run ends. :meth:`start_torch` without waiting; Ctrl-C stops the run.

        One worker per chip (``use_tpu=True``, ``resources_per_worker={"TPU": 1}``); the process
        group and PJRT device follow the cluster: torch_xla ``xla`` on TPUs, gloo with PJRT on CPU
        on the emulator (see :mod:`raytpu_lab.train.torch_run`). The function gets its device and
        keeps gradients in sync with :mod:`raytpu_lab.train.torch_xla_utils`.

        Args:
            train_fn: Per-worker function ``f(config)``; calls ``ray.train.report``.
            topology: e.g. ``"2x2x2"``.
            version: e.g. ``"v5p"``.
            slices: Slices (multi-slice when > 1).
            name: Run name; ``torch-<time>`` if omitted.
            config: Passed to ``train_fn``.
            backend: ``"xla"`` (default on TPUs), ``"tpu_dist"`` or ``"gloo"``.
            chips_per_worker: TPU chips per worker (1: one worker per chip).
            storage_path: Ray Train storage for checkpoints and results.
            wait_s: Seconds to wait for enough idle slices before launching.
            on_launch: Called once checks pass, just before the run starts.
            on_records: Live callback with each batch of reported records.
            reservation: Run on this reservation of the session, as :meth:`train_jax`.
            profile: ``(start, stop)`` or ``"START:STOP"``: trace those steps with torch_xla's
                profiler on every worker (what such a trace holds: :mod:`raytpu_lab.train.profile`);
                the analysis is left in :attr:`last_profile`.
            max_failures, failure_config: Restarts, as :meth:`train_jax`.

        Raises:
            InvalidTopologyError: Bad topology (before Ray is asked).
            TrainingConfigError: torch/torch_xla missing or mismatched, a bad backend, chips per
                worker not dividing a host's chips, or a bad function signature (nothing taken).
            ReservationError: As :meth:`train_jax`.
            NotConnectedError: No cluster connected.
            NoSliceAvailableError: Not enough intact idle slices within ``wait_s``.
            TrainingError: The workers raised (the slices are freed).
            KeyboardInterrupt: Interrupted; the run was stopped and its slices freed first.
        """
        result = self.start_torch(train_fn, topology, version, slices=slices, name=name,
                                  config=config, backend=backend,
                                  chips_per_worker=chips_per_worker, storage_path=storage_path,
                                  wait_s=wait_s, on_launch=on_launch, on_records=on_records,
                                  reservation=reservation, profile=profile,
                                  max_failures=max_failures,
                                  failure_config=failure_config).wait()
        assert isinstance(result, TorchRunResult)
        return result

    def start_torch(self, train_fn: Callable[..., Any], topology: str, version: str, *,
                    slices: int = 1, name: str | None = None,
                    config: dict[str, Any] | None = None, backend: str | None = None,
                    chips_per_worker: int = 1, storage_path: str | None = None,
                    wait_s: float = 60.0, on_launch: Callable[[], None] | None = None,
                    on_records: Callable[[list[dict[str, Any]]], None] | None = None,
                    listener: RunListener | None = None, mute_driver_logs: bool = False,
                    reservation: str | None = None,
                    profile: str | tuple[int, int] | None = None,
                  max_failures: int = 0, failure_config: Any = None) -> RunHandle:
        """Start a ``TorchTrainer`` run (as :meth:`train_torch`) and return its handle at once
        (see :meth:`start_jax`; ``handle.result`` is a ``TorchRunResult``).

        Raises:
            The errors of :meth:`train_torch` raised before launch; worker errors come from
            ``handle.wait()``.
        """
        spec = RunSpec("torch", topology, version, train_fn, slices=slices, name=name,
                       config=config, reservation=reservation, profile=profile,
                       storage_path=storage_path, wait_s=wait_s, backend=backend,
                       chips_per_worker=chips_per_worker,
                       max_failures=max_failures_of(max_failures, failure_config))
        return self.runs.start(spec, on_launch=on_launch, on_records=on_records,
                               listener=listener, mute_driver_logs=mute_driver_logs)
