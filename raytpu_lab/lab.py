"""The session API: one :class:`Session` per kernel does everything the ``%raytpu`` magics do.

The session wires small services, each in its own module and each reading the cluster through
one :class:`~raytpu_lab.session.reader.StateReader` (tests build them around a fake one):
:class:`~raytpu_lab.session.connection.Connection` (emulator, GCS address or Ray Client),
:class:`~raytpu_lab.reservations.service.ReservationService` (whole slices held),
:class:`~raytpu_lab.session.hosts.HostSessions` (per-host processes of a reservation),
:class:`~raytpu_lab.session.kuberay_control.KubeRayControl` (RayClusters on Kubernetes) and
:class:`~raytpu_lab.session.map_feed.MapFeed` (the refresher, live map and status). Its methods
only delegate; every method works the same from a plain Python script. ``Lab`` and
:func:`get_lab` are the names notebooks use.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raytpu_lab._checks import require_positive as _require_positive
from raytpu_lab.cluster import emulator
from raytpu_lab.errors import NoSliceAvailableError, ReservationError, TrainingConfigError
from raytpu_lab.reservations.service import ReservationService
from raytpu_lab.reservations.slices import Reservation, diagnose
from raytpu_lab.reservations.spmd import CellResult, SliceSession
from raytpu_lab.session.connection import Connection
from raytpu_lab.session.hosts import HostSessions
from raytpu_lab.session.kuberay_control import KubeRayControl
from raytpu_lab.session.map_feed import MapFeed
from raytpu_lab.session.reader import SnapshotContext, StateReader
from raytpu_lab.state.fetch import fetch_raw_state
from raytpu_lab.state.model import ClusterSnapshot
from raytpu_lab.tpu.topology import SliceShape
from raytpu_lab.train.launch import RunHandle, RunListener, RunResult, RunUpdate, start_jax
from raytpu_lab.train.on_reservation import SliceLoan
from raytpu_lab.train.profile import parse_profile_window
from raytpu_lab.train.profile_analysis import ProfileReport
from raytpu_lab.train.profile_load import load_profile
from raytpu_lab.train.torch_run import TorchRunResult, check_torch_run, is_emulated, start_torch
from raytpu_lab.train.worker_tap import accepts_config, check_names

if TYPE_CHECKING:
    from raytpu_lab.kuberay.connect import KubeRayTarget
    from raytpu_lab.reservations.info import ReservationInfo
    from raytpu_lab.widgets.status import StatusView
    from raytpu_lab.widgets.topology_map import TopologyMap

__all__ = ["Lab", "Session", "get_lab", "use_session"]


def _forwarded(service: str, name: str, doc: str) -> Any:
    """An attribute of the session that is attribute ``name`` of its service ``service``."""
    return property(lambda self: getattr(getattr(self, service), name),
                    lambda self, value: setattr(getattr(self, service), name, value), doc=doc)


class Session:
    """A notebook's view of one Ray cluster with TPU slices.

    Args:
        reader: How the services read the cluster; Ray through :mod:`raytpu_lab.state.fetch`
            when ``None`` (tests pass a :class:`~raytpu_lab.session.reader.StateReader` over
            recorded or synthetic states).

    Attributes:
        address: The Ray address this session is connected to, or ``None``.
        cluster: The emulated cluster this session started or found, or ``None``.
        last_run: The most recent training run's result.
        kuberay: The RayCluster on Kubernetes this session connected to
            (:meth:`connect_kuberay`), or ``None``.
        last_profile: The analysis of the most recent profiled run (``train_jax(profile=...)``).
        connection, reservation_service, hosts, kube, feed: The services.
    """

    def __init__(self, reader: StateReader | None = None) -> None:
        self.reader = reader or StateReader(connected=lambda: self.connected)
        self.reader.context = self._snapshot_context  # what this session adds to Ray's view
        self.connection = Connection(self.reader, on_switch=self._leave_cluster)
        self.reservation_service = ReservationService(self.reader, on_release=self._close_sessions)
        self.hosts = HostSessions(self.reservation_service)
        self.kube = KubeRayControl(self.connect)
        self.feed = MapFeed(self.snapshot, own_slices=self.reservation_service.own_slices)
        self.last_run: RunResult | None = None
        self.last_profile: ProfileReport | None = None

    # -- cluster ---------------------------------------------------------------------------

    address = _forwarded("connection", "address", "The Ray address connected to, or ``None``.")
    cluster = _forwarded("connection", "cluster", "The emulated cluster connected to, or ``None``.")
    started_cluster = _forwarded(
        "connection", "started", "The emulated cluster this session started with :meth:`up` "
        "(stopped by :meth:`down` and when the kernel exits), or ``None``.")
    kuberay = _forwarded("kube", "target", "The connected RayCluster on Kubernetes, or ``None``.")
    refresher = _forwarded("feed", "refresher", "The session's one poller feeding every live view.")

    @property
    def connected(self) -> bool:
        """Whether this process is a Ray driver connected through this session."""
        return self.connection.connected

    def up(self, tpu: str = "v6e:4x4", slices: int = 2, *, name: str | None = None,
           timeout_s: float = 180.0,
           manifest: str | Path | Mapping[str, Any] | None = None,
           progress: Callable[[int, int], None] | None = None) -> emulator.EmulatedCluster:
        """Start a local emulated TPU cluster and connect to it. See
        :meth:`raytpu_lab.session.connection.Connection.up`."""
        return self.connection.up(tpu, slices, name=name, timeout_s=timeout_s, manifest=manifest,
                                  progress=progress)

    def connect(self, address: str | None = None, *, timeout_s: float = 15.0) -> str:
        """Connect to an existing Ray cluster (GCS ``HOST:PORT`` or ``ray://HOST:PORT``); the
        reservations of the cluster left are given back (detached ones stay). See
        :meth:`raytpu_lab.session.connection.Connection.connect`."""
        return self.connection.connect(address, timeout_s=timeout_s)

    def down(self, name: str | None = None) -> str | None:
        """Release this session's reservations, disconnect, and stop the emulated cluster this
        session started (with :meth:`up`; also after connecting elsewhere since). Idempotent.
        An emulated cluster this session only connected to keeps running, unless named here.

        Args:
            name: Also stop the emulated cluster of this name (if it runs), whoever started it.

        Returns:
            The name of the emulated cluster stopped, or ``None`` if none was.

        Raises:
            EmulatorError: ``name`` names no running emulated cluster (nothing is done then).
        """
        named = self.connection.check_stoppable(name)
        self.hosts.close()
        self.reservation_service.release_all()
        self.kube.drop()
        self.feed.stop("disconnected (%raytpu down)")
        return self.connection.down(named)

    # -- state -----------------------------------------------------------------------------

    def snapshot(self) -> ClusterSnapshot:
        """Read the cluster now: slices -> hosts -> chips with state and health.

        Raises:
            NotConnectedError: No cluster connected.
        """
        return self.reader.snapshot()

    def status(self, highlight: set[str] | None = None) -> StatusView:
        """A view of the snapshot: text table, HTML table and SVG map (for display); rings
        ``highlight`` (this session's slices if ``None``) here and on the live map. See
        :meth:`raytpu_lab.session.map_feed.MapFeed.status`."""
        return self.feed.status(highlight)

    def map(self, *, highlight: set[str] | None = None, interval_s: float | None = None,
            ) -> TopologyMap:
        """The session's live topology map (one widget per session; displaying it again adds a
        view). See :meth:`raytpu_lab.session.map_feed.MapFeed.map`."""
        return self.feed.map(highlight=highlight, interval_s=interval_s)

    # -- reservations ----------------------------------------------------------------------

    def reserve(self, topology: str, version: str, *, slices: int = 1, name: str | None = None,
                timeout_s: float = 60.0, detached: bool = False,
                on_wait: Callable[[float], None] | None = None) -> Reservation:
        """Reserve whole slices atomically. See :meth:`raytpu_lab.reservations.service.ReservationService.reserve`."""
        res = self.reservation_service.reserve(topology, version, slices=slices, name=name,
                                               timeout_s=timeout_s, detached=detached,
                                               on_wait=on_wait)
        self._highlight(set(res.slice_names))
        return res

    def release(self, name: str, *, settle_s: float = 10.0) -> None:
        """Release reservation ``name`` (this session's, or a detached one on the cluster made by
        another kernel) and wait at most ``settle_s`` seconds until Ray shows its slices free
        again, so the next ``status`` or ``reserve`` is truthful. See
        :meth:`raytpu_lab.reservations.service.ReservationService.release`."""
        self.reservation_service.release(name, settle_s=settle_s)

    def reservations(self) -> list[Reservation]:
        """This session's reservations, oldest first."""
        return list(self.reservation_service.held.values())

    def cluster_reservations(self) -> list[ReservationInfo]:
        """Every raytpu reservation on the cluster, whoever made it (placement groups named
        ``raytpu:<name>``), sorted by name, with lifetime (``detached``) and creator job.

        Raises:
            NotConnectedError: No cluster connected.
        """
        return self.reader.reservations()

    def attach(self, name: str) -> Reservation:
        """Adopt a detached reservation another driver (kernel) made, as if this session made it
        (``release``, ``run_on``, ``down`` treat it as this session's; it stays detached). See
        :meth:`raytpu_lab.reservations.service.ReservationService.attach`."""
        res = self.reservation_service.attach(name)
        self._highlight(set(res.slice_names))
        return res

    # -- SPMD on a reservation --------------------------------------------------------------

    def slice_session(self, name: str, *, init_jax: bool = True, timeout_s: float = 120.0,
                      ) -> SliceSession:
        """The persistent host processes of reservation ``name`` (started on first use): one Ray
        actor per host in worker-id order, ``jax.distributed`` initialised once. They live until
        the reservation is released, :meth:`down`, or the kernel exits. See
        :meth:`raytpu_lab.session.hosts.HostSessions.slice_session`."""
        return self.hosts.slice_session(name, init_jax=init_jax, timeout_s=timeout_s)

    def run_on(self, name: str, code_or_fn: str | Callable[..., Any], *args: Any,
               **kwargs: Any) -> CellResult:
        """Run code (a cell's text) or call a function on every host of reservation ``name``;
        variables persist per host from call to call. See
        :meth:`raytpu_lab.session.hosts.HostSessions.run_on`."""
        return self.hosts.run_on(name, code_or_fn, *args, **kwargs)

    # -- training --------------------------------------------------------------------------

    def train_jax(self, train_fn: Callable[..., Any], topology: str, version: str, *,
                  slices: int = 1, name: str | None = None, config: dict[str, Any] | None = None,
                  storage_path: str | None = None, wait_s: float = 60.0,
                  on_launch: Callable[[], None] | None = None,
                  on_records: Callable[[list[dict[str, Any]]], None] | None = None,
                  reservation: str | None = None,
                  profile: str | tuple[int, int] | None = None) -> RunResult:
        """Train with Ray Train's ``JaxTrainer`` on ``slices`` whole slices (one worker per host);
        block until the run ends. :meth:`start_jax` without waiting; Ctrl-C stops the run.

        With ``reservation``, the run goes on exactly that reservation's slices or fails with
        :class:`ReservationError` (see :mod:`raytpu_lab.train.on_reservation`: Ray Train picks
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

        Raises:
            InvalidTopologyError: Bad topology (before Ray is asked).
            TrainingConfigError: Bad config or a function Ray Train cannot call (before launch).
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
                              reservation=reservation, profile=profile).wait()

    def start_jax(self, train_fn: Callable[..., Any], topology: str, version: str, *,
                  slices: int = 1, name: str | None = None, config: dict[str, Any] | None = None,
                  storage_path: str | None = None, wait_s: float = 60.0,
                  on_launch: Callable[[], None] | None = None,
                  on_records: Callable[[list[dict[str, Any]]], None] | None = None,
                  listener: RunListener | None = None, mute_driver_logs: bool = False,
                  reservation: str | None = None,
                  profile: str | tuple[int, int] | None = None) -> RunHandle:
        """Start a ``JaxTrainer`` run (as :meth:`train_jax`) and return its handle at once.

        ``handle.wait()`` blocks for the :class:`RunResult`, ``handle.stop()`` aborts the run and
        frees its slices (within 10 s), ``handle.result`` fills while it runs. ``listener`` (e.g.
        a :class:`~raytpu_lab.widgets.run_dashboard.RunDashboard`) gets every update;
        ``mute_driver_logs`` keeps Ray from also printing the workers' output in this kernel.

        Raises:
            The errors of :meth:`train_jax` raised before launch; worker errors come from
            ``handle.wait()``.
        """
        shape = self.check_jax(train_fn, topology, version, slices=slices, config=config,
                               profile=profile)
        window = parse_profile_window(profile) if profile is not None else None
        run_name = name or f"jax-{time.strftime('%H%M%S')}"
        self.last_profile = None
        return self._start_run(
            lambda **kw: start_jax(train_fn, shape, name=run_name, num_slices=slices,
                                   config=config, storage_path=storage_path, profile=window,
                                   **kw),
            shape, slices, run_name, wait_s=wait_s, on_launch=on_launch, on_records=on_records,
            listener=listener, mute_driver_logs=mute_driver_logs, reservation=reservation,
            after=(lambda result: self._load_profile(result, window)) if window else None)

    def check_jax(self, train_fn: Callable[..., Any] | None, topology: str, version: str, *,
                  slices: int = 1, config: Any = None,
                  profile: str | tuple[int, int] | None = None) -> SliceShape:
        """Every check of a ``JaxTrainer`` run that needs no cluster, as :meth:`start_jax` makes
        them first: the slice shape, ``slices``, the profile window, the config and the
        function's signature. Contacts nothing and starts nothing.

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
        shape = SliceShape.of(version, topology)
        _require_positive("slices", slices)
        if profile is not None:
            parse_profile_window(profile)
        _require_config_dict(config)
        if train_fn is not None:
            accepts_config(train_fn)
            check_names(train_fn)
        return shape

    def check_torch(self, train_fn: Callable[..., Any] | None, topology: str, version: str, *,
                    slices: int = 1, config: Any = None, backend: str | None = None,
                    chips_per_worker: int = 1) -> SliceShape:
        """Every check of a ``TorchTrainer`` run that needs no cluster, as :meth:`start_torch`
        makes them first (see :meth:`check_jax`; also torch/torch_xla installed and matched,
        the backend name and chips per worker). Contacts nothing and starts nothing.

        Raises:
            InvalidTopologyError: Bad generation or topology.
            RaytpuError: ``slices`` is not above 0.
            TrainingConfigError: torch/torch_xla missing or mismatched, a bad backend, chips per
                worker not dividing a host's chips, a bad config or function signature.
        """
        shape = SliceShape.of(version, topology)
        _require_positive("slices", slices)
        _require_config_dict(config)
        check_torch_run(train_fn if train_fn is not None else _no_config, shape, slices,
                        chips_per_worker, backend)
        if train_fn is not None:
            check_names(train_fn)
        return shape

    def _start_run(self, start: Callable[..., RunHandle], shape: SliceShape, slices: int,
                   run_name: str, *, wait_s: float, on_launch: Callable[[], None] | None,
                   on_records: Callable[[list[dict[str, Any]]], None] | None,
                   listener: RunListener | None, mute_driver_logs: bool,
                   reservation: str | None = None,
                   after: Callable[[RunResult], None] | None = None) -> RunHandle:
        """Checks, launch and bookkeeping shared by every trainer: ``start(**kwargs)`` calls
        :func:`~raytpu_lab.train.launch.start_run` (through ``start_jax``...) with ours.

        With ``reservation``, the run is lent that reservation's slices (a
        :class:`~raytpu_lab.train.on_reservation.SliceLoan`): it lands there or is aborted, and
        the reservation takes its slices back when the run ends."""
        self._require_connection(f"launch run {run_name!r}")
        loan = self._loan(reservation, shape, slices, wait_s) if reservation is not None else None
        if loan is None:
            self._wait_for_idle(shape, slices, wait_s)
        if on_launch is not None:
            on_launch()
        label = f"run {run_name}"
        box: list[RunHandle] = []

        def placed(slice_names: list[str], pg_ids: list[str]) -> None:
            self._jobs.update({pg: label for pg in pg_ids})
            self._highlight(set(slice_names))
            # Multi-slice: the slices talk over DCN; kept, like the highlight, until the next run.
            self._mark_dcn([slice_names] if slices > 1 else [])

        lab = self

        class _Bookkeeping:
            def on_update(self, update: RunUpdate) -> None:
                if listener is not None:
                    listener.on_update(update)

            def on_end(self, result: RunResult) -> None:
                lab._jobs = {pg: v for pg, v in lab._jobs.items() if v != label}
                lab.last_run = result
                if loan is not None and box:
                    box[0].failure = loan.end()
                if after is not None:
                    after(result)
                if listener is not None:
                    listener.on_end(result)

        abort_wanted = threading.Event()

        def abort() -> None:
            # Never block the loan's watcher on stop(): stop waits for on_end, which ends the loan.
            abort_wanted.set()
            if box:
                threading.Thread(target=box[0].stop, daemon=True).start()

        if loan is not None:
            loan.begin(abort=abort)
        try:
            handle = start(snapshot=self.snapshot, on_records=on_records, on_placement=placed,
                           listener=_Bookkeeping(), mute_driver_logs=mute_driver_logs)
        except BaseException:
            if loan is not None:
                loan.end()
            raise
        box.append(handle)
        if abort_wanted.is_set():  # the loan gave up before the handle existed
            threading.Thread(target=handle.stop, daemon=True).start()
        return handle


    # -- KubeRay ---------------------------------------------------------------------------

    def connect_kuberay(self, name: str, *, namespace: str | None = None,
                        context: str | None = None, kubeconfig: str | None = None,
                        address: str | None = None, port_forward: bool = True,
                        timeout_s: float = 15.0) -> KubeRayTarget:
        """Connect to RayCluster ``name`` on Kubernetes (KubeRay on GKE) with the ``kubernetes``
        client. See :meth:`raytpu_lab.session.kuberay_control.KubeRayControl.connect`."""
        return self.kube.connect(name, namespace=namespace, context=context,
                                 kubeconfig=kubeconfig, address=address,
                                 port_forward=port_forward, timeout_s=timeout_s)

    def apply(self, manifest: str | Path | Mapping[str, Any], *, namespace: str | None = None,
              context: str | None = None, kubeconfig: str | None = None) -> dict[str, Any]:
        """Validate a RayCluster manifest and create or update it on Kubernetes (server-side
        apply). See :meth:`raytpu_lab.session.kuberay_control.KubeRayControl.apply`."""
        return self.kube.apply(manifest, namespace=namespace, context=context,
                               kubeconfig=kubeconfig)

    def scale(self, group: str, slices: int, *, name: str | None = None,
              namespace: str | None = None, context: str | None = None,
              kubeconfig: str | None = None) -> list[str]:
        """Set a TPU worker group's slice count (``replicas``) on Kubernetes. See
        :meth:`raytpu_lab.session.kuberay_control.KubeRayControl.scale`."""
        return self.kube.scale(group, slices, name=name, namespace=namespace, context=context,
                               kubeconfig=kubeconfig)

    def delete_raycluster(self, name: str | None = None, *, yes: bool = False,
                          namespace: str | None = None, context: str | None = None,
                          kubeconfig: str | None = None) -> str:
        """Delete a RayCluster on Kubernetes (KubeRay then deletes its pods: every slice goes);
        disconnects if it is the connected one.

        Args:
            name: The RayCluster; the connected one when ``None``.
            yes: Confirmation; required, because this frees TPUs other people may be using.

        Returns:
            The deleted RayCluster's name.

        Raises:
            RaytpuError: Not confirmed, or no RayCluster named and none connected.
            KubernetesError: As :meth:`connect_kuberay`.
        """
        deleted, was_connected = self.kube.delete(name, yes=yes, namespace=namespace,
                                                  context=context, kubeconfig=kubeconfig)
        if was_connected:
            self.connection.disconnect(forget_cluster=False)
        return deleted

    def train_torch(self, train_fn: Callable[..., Any], topology: str, version: str, *,
                    slices: int = 1, name: str | None = None,
                    config: dict[str, Any] | None = None, backend: str | None = None,
                    chips_per_worker: int = 1, storage_path: str | None = None,
                    wait_s: float = 60.0, on_launch: Callable[[], None] | None = None,
                    on_records: Callable[[list[dict[str, Any]]], None] | None = None,
                    ) -> TorchRunResult:
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

        Raises:
            InvalidTopologyError: Bad topology (before Ray is asked).
            TrainingConfigError: torch/torch_xla missing or mismatched, a bad backend, chips per
                worker not dividing a host's chips, or a bad function signature (nothing taken).
            NotConnectedError: No cluster connected.
            NoSliceAvailableError: Not enough intact idle slices within ``wait_s``.
            TrainingError: The workers raised (the slices are freed).
            KeyboardInterrupt: Interrupted; the run was stopped and its slices freed first.
        """
        result = self.start_torch(train_fn, topology, version, slices=slices, name=name,
                                  config=config, backend=backend,
                                  chips_per_worker=chips_per_worker, storage_path=storage_path,
                                  wait_s=wait_s, on_launch=on_launch, on_records=on_records).wait()
        assert isinstance(result, TorchRunResult)
        return result

    def start_torch(self, train_fn: Callable[..., Any], topology: str, version: str, *,
                    slices: int = 1, name: str | None = None,
                    config: dict[str, Any] | None = None, backend: str | None = None,
                    chips_per_worker: int = 1, storage_path: str | None = None,
                    wait_s: float = 60.0, on_launch: Callable[[], None] | None = None,
                    on_records: Callable[[list[dict[str, Any]]], None] | None = None,
                    listener: RunListener | None = None, mute_driver_logs: bool = False,
                    ) -> RunHandle:
        """Start a ``TorchTrainer`` run (as :meth:`train_torch`) and return its handle at once
        (see :meth:`start_jax`; ``handle.result`` is a ``TorchRunResult``).

        Raises:
            The errors of :meth:`train_torch` raised before launch; worker errors come from
            ``handle.wait()``.
        """
        shape = self.check_torch(train_fn, topology, version, slices=slices, config=config,
                                 backend=backend, chips_per_worker=chips_per_worker)
        self._require_connection("launch a TorchTrainer run")
        emulated = is_emulated(self.snapshot(), shape)
        run_name = name or f"torch-{time.strftime('%H%M%S')}"
        return self._start_run(
            lambda **kw: start_torch(train_fn, shape, name=run_name, num_slices=slices,
                                     config=config, backend=backend,
                                     chips_per_worker=chips_per_worker, emulated=emulated,
                                     storage_path=storage_path, **kw),
            shape, slices, run_name, wait_s=wait_s, on_launch=on_launch, on_records=on_records,
            listener=listener, mute_driver_logs=mute_driver_logs)

    # -- helpers ---------------------------------------------------------------------------

    def _load_profile(self, result: RunResult, window: Any) -> None:
        """After a profiled run: analyse its traces into :attr:`last_profile`."""
        self.last_profile = load_profile(result.storage_path, (window.start, window.stop))

    def _loan(self, name: str, shape: SliceShape, slices: int, wait_s: float) -> SliceLoan:
        """Reservation ``name``'s slices, to lend to a Ray Train run of ``slices`` x ``shape``."""
        res = self._reservations.get(name)
        if res is None:
            raise ReservationError(f"No reservation named {name!r} in this session.",
                                   why=f"Reservations held: {', '.join(self._reservations) or 'none'}.",
                                   fix="Reserve it first, or attach a detached one (%raytpu attach).")
        if (res.shape.pod_type, res.shape.topology, len(res.slice_names)) != (
                shape.pod_type, shape.topology, slices):
            raise ReservationError(
                f"Reservation {name!r} holds {len(res.slice_names)} x {res.shape.pod_type} "
                f"({res.shape.topology}), not {slices} x {shape.pod_type} ({shape.topology}).",
                fix=f"Use --topology {res.shape.topology} --version {res.shape.version} "
                    f"--slices {len(res.slice_names)}, or leave them out with --reservation.")
        self._close_sessions(name)  # its host processes hold the chips the run needs
        return SliceLoan(res, self.snapshot, fetch_raw_state, wait_s=wait_s)

    def _wait_for_idle(self, shape: SliceShape, slices: int, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while True:
            snap = self.snapshot()
            intact = [s for s in snap.slices_of(shape.pod_type) if s.health == "intact"]
            if len(intact) < slices:
                raise diagnose(snap, shape, slices, timeout_s=0.0, impossible=True)
            if len(snap.idle_slices(shape.pod_type)) >= slices:
                return
            own = {r.name for r in self._reservations.values()}
            usable = [s for s in intact if not set(s.owners) <= own or not s.owners]
            if len(usable) < slices:
                held = ", ".join(f"{s.name} (your reservation {'/'.join(s.owners)})"
                                 for s in intact if s.owners and set(s.owners) <= own)
                raise NoSliceAvailableError(
                    f"Cannot launch on {slices} slice(s) of {shape.pod_type}: this session holds "
                    f"them: {held}.",
                    why="JaxTrainer reserves its own slices; Ray Train does not accept a "
                        "placement group or label selector together with use_tpu.",
                    fix="Release the reservation first (%raytpu release NAME).",
                    pod_type=shape.pod_type, slices_needed=slices)
            if time.monotonic() >= deadline:
                raise diagnose(snap, shape, slices, timeout_s=wait_s, wait_option="--wait")
            time.sleep(0.5)


    # -- what the services and the training section share ----------------------------------

    @property
    def _jobs(self) -> dict[str, str]:
        """``{placement group id: "run <name>"}`` while runs go on (the map feed's labels)."""
        return self.feed.jobs

    @_jobs.setter
    def _jobs(self, jobs: dict[str, str]) -> None:
        self.feed.jobs = jobs

    @property
    def _reservations(self) -> dict[str, Reservation]:
        """This session's reservations by name (the reservation service's, not a copy)."""
        return self.reservation_service.held

    def _highlight(self, slices: set[str]) -> None:
        self.feed.highlight(slices)

    def _mark_dcn(self, groups: list[list[str]]) -> None:
        self.feed.mark_dcn(groups)

    def _close_sessions(self, name: str | None = None) -> None:
        self.hosts.close(name)

    def require_connection(self, doing: str) -> None:
        """Raise unless a cluster is connected (``doing``: what needs it, e.g. "reserve a slice").

        Raises:
            NotConnectedError: No cluster connected; the message says how to connect.
        """
        self.reader.require(doing)

    _require_connection = require_connection

    def _snapshot_context(self) -> SnapshotContext:
        cluster = self.connection.cluster
        kube_expected, planned = self.kube.expectation()
        expected = (cluster.expected_hosts if cluster else None) or kube_expected
        return SnapshotContext(expected_hosts=expected, jobs=self.feed.jobs, planned=planned)

    def _leave_cluster(self) -> None:
        """Before connecting elsewhere: give back what belongs to the cluster left."""
        self.hosts.close()
        self.reservation_service.release_all(keep_detached=True)
        self.kube.drop()

    def _at_exit(self) -> None:
        """Kernel exit or restart: release this session's reservations (detached ones stay)
        and stop the emulated cluster this session started with :meth:`up`."""
        self.hosts.close()
        self.reservation_service.release_all(keep_detached=True)
        self.connection.at_exit()


Lab = Session
"""The session's older name (notebooks and the README use ``get_lab()``)."""


def _no_config() -> None:
    """Stands in for a training function not known yet (see :meth:`Lab.check_torch`)."""


def _require_config_dict(config: Any) -> None:
    if config is not None and not isinstance(config, dict):
        raise TrainingConfigError(
            f"The training config is a {type(config).__name__}, not a dict.",
            why="Ray Train passes train_loop_config to the function as a dict.",
            fix="Pass a dict, e.g. --config \"{'steps': 100}\".")


_LAB: Session | None = None


def get_lab() -> Session:
    """The kernel's one :class:`Session` (created on first use; what the magics use)."""
    global _LAB
    if _LAB is None:
        _LAB = Session()
        atexit.register(_LAB._at_exit)
    return _LAB


@contextmanager
def use_session(session: Session) -> Iterator[Session]:
    """Make ``session`` the kernel's session (:func:`get_lab`, the magics) inside the block,
    e.g. a test's fresh one; the previous one is back afterwards (nothing is registered at exit)."""
    global _LAB
    previous, _LAB = _LAB, session
    try:
        yield session
    finally:
        _LAB = previous
