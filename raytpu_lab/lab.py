"""The session API: one :class:`Lab` per kernel does everything the ``%raytpu`` magics do.

Connect (emulator, GCS address or Ray Client), read the cluster as a snapshot, reserve and release
whole slices, and launch ``JaxTrainer`` runs. The magics parse arguments and call these methods;
every method works the same from a plain Python script.
"""

from __future__ import annotations

import atexit
import itertools
import math
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from raytpu_lab import _ray_private
from raytpu_lab.cluster import emulator
from raytpu_lab.cluster.connect import connect, disconnect, probe, wait_for_nodes
from raytpu_lab.errors import (
    ConnectError,
    EmulatorError,
    NotConnectedError,
    RaytpuError,
    ReservationError,
)
from raytpu_lab.refresher import Refresher
from raytpu_lab.reserve import Reservation, adopt, reserve
from raytpu_lab.spmd import CellResult, SliceSession, check_cell
from raytpu_lab.state.fetch import fetch_placement_group_lifetimes, fetch_raw_state
from raytpu_lab.state.model import ClusterSnapshot, build_snapshot
from raytpu_lab.state.reservations import ReservationInfo, list_reservations
from raytpu_lab.tpu.topology import SliceShape, parse_spec
from raytpu_lab.train.profile_analysis import ProfileReport
from raytpu_lab.train.result import RunResult
from raytpu_lab.train.run import RunHandle, RunListener
from raytpu_lab.train.service import Runs
from raytpu_lab.train.spec import RunSpec, validate
from raytpu_lab.train.torch_run import TorchRunResult
from raytpu_lab.widgets.status import StatusView
from raytpu_lab.widgets.topology_map import TopologyMap

if TYPE_CHECKING:
    from raytpu_lab.cluster.kuberay_connect import KubeRayTarget

__all__ = ["Lab", "get_lab"]

_NODE_JOIN_TIMEOUT_S = 90.0


def default_address() -> str:
    """The Ray address to use when none is given: ``$RAY_ADDRESS``, else the one emulated
    cluster running on this machine.

    Raises:
        ConnectError: Neither is there, or several emulated clusters run (they are listed).
    """
    env = os.environ.get("RAY_ADDRESS", "").strip()
    if env:
        return env
    clusters = emulator.running()
    if len(clusters) == 1:
        return clusters[0].address
    if clusters:
        listed = "; ".join(f"{c.name} at {c.address}" for c in clusters)
        raise ConnectError(f"{len(clusters)} emulated clusters run on this machine; which one?",
                           why=listed, fix="Give its address: %raytpu connect ADDRESS.")
    raise ConnectError("No Ray cluster to connect to: no address given, RAY_ADDRESS is not set "
                       "and no emulated cluster runs on this machine.",
                       fix="Give the address (%raytpu connect HOST:6379, or ray://HOST:10001), "
                           "connect to a RayCluster on Kubernetes (%raytpu connect --kuberay "
                           "NAME), or start an emulated cluster (%raytpu up).")


class Lab:
    """A notebook's view of one Ray cluster with TPU slices.

    Attributes:
        address: The Ray address this session is connected to, or ``None``.
        cluster: The emulated cluster this session started or found, or ``None``.
        last_run: The most recent training run's result.
        kuberay: The RayCluster on Kubernetes this session connected to
            (:meth:`connect_kuberay`), or ``None``.
        last_profile: The analysis of the most recent profiled run (``train_jax(profile=...)``).
    """

    def __init__(self) -> None:
        self.address: str | None = None
        self.cluster: emulator.EmulatedCluster | None = None
        self._reservations: dict[str, Reservation] = {}
        self._names = itertools.count(1)
        self._jobs: dict[str, str] = {}  # placement group id -> "run <name>", while it runs
        self.refresher = Refresher(self.snapshot)
        self._map: TopologyMap | None = None
        self.kuberay: KubeRayTarget | None = None
        self._sessions: dict[str, SliceSession] = {}  # reservation name -> its host processes
        self._started: emulator.EmulatedCluster | None = None  # what `up` started, until `down`
        # Late-bound: tests (and subclasses) that replace snapshot/_require_connection reach it.
        self.runs = Runs(lambda: self.snapshot(), lambda doing: self._require_connection(doing),
                         reservation=self._reservation_for_run,
                         held=lambda: [r.name for r in self._reservations.values()],
                         release_hosts=self._close_sessions, on_placed=self._run_placed,
                         on_ended=self._run_ended)

    # -- cluster ---------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Whether this process is a Ray driver connected through this session."""
        return self.address is not None and ray.is_initialized()

    def up(self, tpu: str = "v6e:4x4", slices: int = 2, *, name: str | None = None,
           timeout_s: float = 180.0,
           manifest: str | Path | Mapping[str, Any] | None = None,
           progress: Callable[[int, int], None] | None = None) -> emulator.EmulatedCluster:
        """Start a local emulated TPU cluster and connect to it.

        Args:
            tpu: ``"<version>:<topology>"``, e.g. ``"v6e:4x4"``, ``"v4:2x2x2"``, ``"v5e:2x2"``.
            slices: Number of slices of that shape.
            name: Cluster name (one emulated cluster per name); ``"raytpu"``, or the manifest's
                ``metadata.name``, when ``None``.
            timeout_s: Seconds to wait for every node to start.
            manifest: A RayCluster manifest (file path or dict) to emulate instead of ``tpu`` /
                ``slices``: its TPU worker groups, slices, hosts and container env
                (:mod:`raytpu_lab.cluster.kuberay_emulator`).
            progress: Called as ``progress(hosts up, hosts expected)`` while hosts start.

        An emulated cluster of this name that already runs with at least the slices asked for
        (started by ``raytpu up``, another notebook, or before a kernel restart) is joined instead:
        nothing is started, and :meth:`down` leaves it running (:attr:`started_cluster` is
        ``None``).

        Returns:
            The running cluster (``address``, ``dashboard_url``, ``hosts``).

        Raises:
            InvalidTopologyError: ``tpu`` is not a valid spec (nothing is started).
            ManifestError: The manifest fails the CRD schema or the TPU rules (nothing is started).
            EmulatorError: A cluster with this name runs already without the slices asked for
                (the message says how to reach or stop it), or nodes failed to start or join.
        """
        started = True
        if manifest is not None:
            from raytpu_lab.cluster.kuberay_emulator import up_from_manifest

            cluster = up_from_manifest(manifest, name=name, timeout_s=timeout_s,
                                       progress=progress)
        else:
            parse_spec(tpu)
            running = emulator.find(name or emulator.DEFAULT_NAME)
            if running is not None and not _answers(running.address):
                # Left half-stopped (a kernel killed while it stopped its cluster): its head no
                # longer answers, so nobody can be using it; stop what is left, start anew.
                running.down(timeout_s=2.0)
                running = None
            if running is not None and running.holds([(tpu, slices)]):
                # Re-running a notebook's `up` cell (after a kernel restart, or many notebooks
                # in one test session) joins the cluster that already has what it asks for.
                cluster, started = running, False
            else:
                cluster = emulator.up([(tpu, slices)], name=name or emulator.DEFAULT_NAME,
                                      timeout_s=timeout_s, progress=progress)
        try:
            self.connect(cluster.address)
            expected = len(cluster.hosts) + 1
            seen = wait_for_nodes(_alive_nodes, expected, _NODE_JOIN_TIMEOUT_S)
            if seen < expected:
                raise EmulatorError(
                    f"Only {seen} of {expected} emulated nodes joined Ray within "
                    f"{_NODE_JOIN_TIMEOUT_S:.0f} s.",
                    why=f"Node logs are in {cluster.folder / 'logs'}.",
                    fix=f"Start fewer slices, or check memory (about "
                        f"{emulator.HOST_MEMORY_BYTES // 2**20} MB per host).")
        except BaseException:
            self.address = None
            disconnect()
            if started:
                cluster.down()
            raise
        self.cluster = cluster
        self._started = cluster if started else None
        return cluster

    def connect(self, address: str | None = None, *, timeout_s: float = 15.0) -> str:
        """Connect to an existing Ray cluster (GCS ``HOST:PORT`` or ``ray://HOST:PORT``).

        Args:
            address: Where the cluster is. ``None``: ``$RAY_ADDRESS`` if set (as ``ray.init()``
                reads it), else the one emulated cluster running on this machine (started by
                another notebook or ``raytpu up``).
            timeout_s: Seconds to wait for the cluster to answer.

        Returns:
            The address connected to.

        Raises:
            ConnectError: No address was given and none could be found (or several emulated
                clusters run), nothing answered within ``timeout_s`` seconds, or Ray refused.
            RaytpuError: ``timeout_s`` is not a finite number above 0.
        """
        _require_positive("timeout", timeout_s)
        address = address or default_address()
        probe(address, timeout_s=timeout_s)  # fail before dropping the current connection
        self._forget_reservations()
        self._drop_kuberay()
        found = [c for c in emulator.running()
                 if address in (c.address, f"ray://127.0.0.1:{c.client_port}")]
        if found:
            _ray_private.enable_token_auth()  # emulated clusters run with Ray token auth
        connect(address, timeout_s=timeout_s, ship_package=not found)
        self.address = address
        self.cluster = found[0] if found else None
        return address

    @property
    def started_cluster(self) -> emulator.EmulatedCluster | None:
        """The emulated cluster this session started with :meth:`up` (stopped by :meth:`down`
        and when the kernel exits), or ``None``."""
        return self._started

    def down(self, name: str | None = None) -> str | None:
        """Release this session's reservations, disconnect, and stop the emulated cluster this
        session started (with :meth:`up`; also after connecting elsewhere since). Idempotent.

        An emulated cluster this session only connected to (started by ``raytpu up`` or another
        notebook) keeps running for its other users, unless named here.

        Args:
            name: Also stop the emulated cluster of this name (if it runs), whoever started it.

        Returns:
            The name of the emulated cluster stopped, or ``None`` if none was.

        Raises:
            EmulatorError: ``name`` names no running emulated cluster (nothing is done then).
        """
        named = emulator.find(name) if name is not None else None
        if name is not None and named is None:
            others = [c.name for c in emulator.running()]
            raise EmulatorError(
                f"No emulated cluster named {name!r} is running.",
                why="Nothing was stopped or disconnected.",
                fix=(f"Name one that runs: {', '.join(others)}." if others
                     else "No emulated cluster runs on this machine."))
        self._close_sessions()
        for res in list(self._reservations.values()):
            res.release()
        self._reservations.clear()
        started, self._started = self._started, None
        self._drop_kuberay()
        self.refresher.stop()
        if self._map is not None:
            self._map.set_status("disconnected (%raytpu down)")
        self.address = None
        self.cluster = None
        disconnect()
        stopped = None
        for cluster in (started, named):
            if cluster is not None and cluster.is_running():
                cluster.down()
                stopped = stopped or cluster.name
        return stopped

    # -- state -----------------------------------------------------------------------------

    def snapshot(self) -> ClusterSnapshot:
        """Read the cluster now: slices -> hosts -> chips with state and health.

        Raises:
            NotConnectedError: No cluster connected.
        """
        self._require_connection("read the cluster state")
        expected = self.cluster.expected_hosts if self.cluster else None
        planned = None
        if self.kuberay is not None:
            planned = self.kuberay.planned()
            expected = expected or self.kuberay.plan.expected_hosts
        return build_snapshot(fetch_raw_state(), expected_hosts=expected, jobs=dict(self._jobs),
                              planned=planned)

    def status(self, highlight: set[str] | None = None) -> StatusView:
        """A view of the snapshot: text table, HTML table and SVG map (for display).

        Also rings the same slices on the live map, if one is shown.
        """
        marked = highlight if highlight is not None else self._own_slices()
        snapshot = self.snapshot()
        self._highlight(marked)
        return StatusView(snapshot, highlight=marked)

    def map(self, *, highlight: set[str] | None = None, interval_s: float | None = None,
            ) -> TopologyMap:
        """The session's live topology map (one widget per session; displaying it again adds a view).

        Args:
            highlight: Slices to ring; this session's reservations if ``None``.
            interval_s: Seconds between refreshes (the session's one refresher; default 1 s).

        Raises:
            NotConnectedError: No cluster connected.
        """
        snapshot = self.snapshot()
        if interval_s is not None:
            self.refresher.interval_s = interval_s
        marked = highlight if highlight is not None else self._own_slices()
        if self._map is None or getattr(self._map, "closed", False):
            self._map = TopologyMap(snapshot, highlight=marked)
        else:
            self._map.update(snapshot)
            self._map.set_highlight(marked)
        self.refresher.add(self._map)
        return self._map

    # -- reservations ----------------------------------------------------------------------

    def reserve(self, topology: str, version: str, *, slices: int = 1, name: str | None = None,
                timeout_s: float = 60.0, detached: bool = False,
                on_wait: Callable[[float], None] | None = None) -> Reservation:
        """Reserve whole slices atomically (see :func:`raytpu_lab.reserve.reserve`).

        Args:
            topology: e.g. ``"4x4"``.
            version: e.g. ``"v6e"``.
            slices: Slices to hold together.
            name: Reservation name; ``r1``, ``r2``... if omitted.
            timeout_s: Seconds to wait for free slices.
            detached: Keep it after this kernel exits.
            on_wait: Progress callback, called with seconds elapsed while waiting.

        Raises:
            InvalidTopologyError: Topology not valid for the generation (nothing requested).
            NotConnectedError: No cluster connected.
            ReservationError: The name is taken.
            NoSliceAvailableError: No intact idle slices within ``timeout_s`` (or never enough).
        """
        shape = SliceShape.of(version, topology)
        _require_positive("timeout", timeout_s)
        _require_positive("slices", slices)
        self._require_connection("reserve a slice")
        if name is not None and (not name.strip() or any(c.isspace() for c in name)):
            raise ReservationError(f"{name!r} is not a reservation name.",
                                   why="Names are one word: they name placement groups.",
                                   fix="Use letters, digits, '-' or '_', e.g. --name r1.")
        name = name or self._next_name()
        if name in self._reservations:
            raise ReservationError(f"A reservation named {name!r} exists already.",
                                   fix=f"Pick another name, or release it first: %raytpu release {name}")
        res = reserve(shape, self.snapshot, name=name, num_slices=slices, timeout_s=timeout_s,
                      detached=detached, on_wait=on_wait)
        self._reservations[name] = res
        self._highlight(set(res.slice_names))
        return res

    def release(self, name: str, *, settle_s: float = 10.0) -> None:
        """Release reservation ``name`` and wait until Ray shows its slices free again.

        ``name`` is one of this session's reservations or a detached one on the cluster (made
        by another kernel; see :meth:`cluster_reservations`).

        Ray removes the placement groups at once, but nodes report the freed chips a moment later;
        waiting (at most ``settle_s`` seconds) keeps the next ``status`` or ``reserve`` truthful.

        Raises:
            ReservationError: Neither this session nor the cluster (detached) holds a reservation
                of that name.
        """
        res = self._reservations.pop(name, None)
        if res is None and self.connected:
            res = self._adopt_detached(name)  # a detached one made by another driver, if any
        if res is None:
            held = ", ".join(self._reservations) or "none"
            raise ReservationError(f"No reservation named {name!r} in this session.",
                                   why=f"Reservations held: {held}.",
                                   fix="List them with %raytpu reservations.")
        self._close_sessions(name)
        res.release()
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline:
            snap = self.snapshot()
            if all(s.idle for s in snap.slices if s.name in res.slice_names):
                return
            time.sleep(0.2)

    def reservations(self) -> list[Reservation]:
        """This session's reservations, oldest first."""
        return list(self._reservations.values())

    def cluster_reservations(self) -> list[ReservationInfo]:
        """Every raytpu reservation on the cluster, whoever made it (placement groups named
        ``raytpu:<name>``), sorted by name, with lifetime (``detached``) and creator job.

        Raises:
            NotConnectedError: No cluster connected.
        """
        self._require_connection("list the cluster's reservations")
        return list_reservations(fetch_raw_state(), fetch_placement_group_lifetimes())

    def attach(self, name: str) -> Reservation:
        """Adopt a detached reservation another driver (kernel) made, as if this session made it.

        Afterwards ``release``, ``run_on``, ``down`` treat it as this session's; it stays
        detached (it survives this kernel too unless released).

        Raises:
            NotConnectedError: No cluster connected.
            ReservationError: No detached reservation of that name on the cluster (the message
                lists those that exist), or this session holds one of that name already.
        """
        self._require_connection("attach a reservation")
        if name in self._reservations:
            raise ReservationError(f"Reservation {name!r} is this session's already.",
                                   fix="Use it directly, or release it: %raytpu release " + name)
        res = self._adopt_detached(name)
        if res is None:
            infos = self.cluster_reservations()
            listed = ", ".join(f"{r.name} ({'detached' if r.detached else 'default lifetime'})"
                               for r in infos) or "none"
            info = next((r for r in infos if r.name == name), None)
            why = (f"{name!r} has the default lifetime: it belongs to the driver that made it and "
                   "ends with it." if info is not None else f"Reservations on the cluster: {listed}.")
            raise ReservationError(f"No detached reservation named {name!r} on the cluster.",
                                   why=why, fix="List them with %raytpu reservations --all.")
        self._reservations[name] = res
        self._highlight(set(res.slice_names))
        return res

    def _adopt_detached(self, name: str) -> Reservation | None:
        info = next((r for r in self.cluster_reservations() if r.name == name and r.detached), None)
        if info is None:
            return None
        if not info.slice_names or not info.topology:
            raise ReservationError(
                f"Reservation {name!r} is on the cluster but not placed ({info.state}).",
                why="Its bundles sit on no live host, so its slices are unknown.",
                fix=f"Release it from the kernel that made it, or wait; state: {info.state}.")
        slice_state = self.snapshot().slice(info.slice_names[0])
        if not isinstance(slice_state.shape, SliceShape):
            raise ReservationError(
                f"Reservation {name!r} is on slice {slice_state.name}, whose TPU shape is unknown "
                f"({slice_state.shape.spec}).",
                why="Its labels name no shape in the topology tables, so its hosts and chips "
                    "cannot be checked against a shape.",
                fix="Release it from the kernel that made it.")
        return adopt(info, slice_state.shape)

    # -- SPMD on a reservation --------------------------------------------------------------

    def slice_session(self, name: str, *, init_jax: bool = True, timeout_s: float = 120.0,
                      ) -> SliceSession:
        """The persistent host processes of reservation ``name`` (started on first use).

        One Ray actor per host, placed on the reservation's bundles in worker-id order, with
        ``jax.distributed`` initialised once (coordinator on worker 0). They live until the
        reservation is released, :meth:`down`, or the kernel exits.

        Raises:
            ReservationError: This session holds no reservation ``name`` (attach it first if
                another kernel made it), or its hosts are not all placed.
            RemoteHostError: A host failed to start or to initialise JAX.
        """
        res = self._reservations.get(name)
        if res is None:
            held = ", ".join(self._reservations) or "none"
            raise ReservationError(f"No reservation named {name!r} in this session.",
                                   why=f"Reservations held: {held}.",
                                   fix="Reserve one (%raytpu reserve ...) or adopt a detached one "
                                       "(%raytpu attach NAME).")
        session = self._sessions.get(name)
        if session is None or not session.started:
            session = SliceSession(res, init_jax=init_jax, timeout_s=timeout_s)
            self._sessions[name] = session
            session.start()
        return session

    def run_on(self, name: str, code_or_fn: str | Callable[..., Any], *args: Any,
               **kwargs: Any) -> CellResult:
        """Run code (a cell's text) or call a function on every host of reservation ``name``.

        Variables persist per host from call to call (each host has its own namespace).

        Returns:
            Output per host in worker-id order; ``.values`` is the list of return values (a
            cell's last expression).

        Raises:
            SyntaxError: The code does not parse (nothing was started or sent).
            ReservationError: See :meth:`slice_session`.
            RemoteHostError: It raised on a host (that host's traceback; ``.result`` has all).
            KeyboardInterrupt: Interrupted; the cell was stopped on every host first.
        """
        if isinstance(code_or_fn, str):
            check_cell(code_or_fn)  # before a session (host actors, jax.distributed) is started
        session = self.slice_session(name)
        if isinstance(code_or_fn, str):
            return session.run(code_or_fn)
        return session.call(code_or_fn, *args, **kwargs)

    def _close_sessions(self, name: str | None = None) -> None:
        for key in [name] if name is not None else list(self._sessions):
            session = self._sessions.pop(key, None) if key is not None else None
            if session is not None:
                session.close()

    # -- training --------------------------------------------------------------------------
    # Every run goes through self.runs (raytpu_lab.train.service.Runs); these methods only build
    # its RunSpec. The session keeps the map highlight and the job labels (on_placed/on_ended).

    @property
    def last_run(self) -> RunResult | None:
        """The most recent training run's result."""
        return self.runs.last_run

    @last_run.setter
    def last_run(self, value: RunResult | None) -> None:
        self.runs.last_run = value

    @property
    def last_profile(self) -> ProfileReport | None:
        """The analysis of the most recent profiled run (``train_jax(profile=...)``)."""
        return self.runs.last_profile

    @last_profile.setter
    def last_profile(self, value: ProfileReport | None) -> None:
        self.runs.last_profile = value

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
        spec = RunSpec("jax", topology, version, train_fn, slices=slices, name=name,
                       config=config, reservation=reservation, profile=profile,
                       storage_path=storage_path, wait_s=wait_s)
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
                    profile: str | tuple[int, int] | None = None) -> TorchRunResult:
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
                                  reservation=reservation, profile=profile).wait()
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
                    profile: str | tuple[int, int] | None = None) -> RunHandle:
        """Start a ``TorchTrainer`` run (as :meth:`train_torch`) and return its handle at once
        (see :meth:`start_jax`; ``handle.result`` is a ``TorchRunResult``).

        Raises:
            The errors of :meth:`train_torch` raised before launch; worker errors come from
            ``handle.wait()``.
        """
        spec = RunSpec("torch", topology, version, train_fn, slices=slices, name=name,
                       config=config, reservation=reservation, profile=profile,
                       storage_path=storage_path, wait_s=wait_s, backend=backend,
                       chips_per_worker=chips_per_worker)
        return self.runs.start(spec, on_launch=on_launch, on_records=on_records,
                               listener=listener, mute_driver_logs=mute_driver_logs)

    def _run_placed(self, label: str, slice_names: list[str], pg_ids: list[str],
                    num_slices: int) -> None:
        """A run's slices are known: label its placement groups, highlight its slices."""
        self._jobs.update({pg: label for pg in pg_ids})
        self._highlight(set(slice_names))
        # Multi-slice: the slices talk over DCN; kept, like the highlight, until the next run.
        self._mark_dcn([slice_names] if num_slices > 1 else [])

    def _run_ended(self, label: str) -> None:
        self._jobs = {pg: v for pg, v in self._jobs.items() if v != label}

    def _reservation_for_run(self, name: str) -> Reservation:
        res = self._reservations.get(name)
        if res is None:
            raise ReservationError(f"No reservation named {name!r} in this session.",
                                   why=f"Reservations held: {', '.join(self._reservations) or 'none'}.",
                                   fix="Reserve it first, or attach a detached one (%raytpu attach).")
        return res

    # -- KubeRay ---------------------------------------------------------------------------

    def connect_kuberay(self, name: str, *, namespace: str | None = None,
                        context: str | None = None, kubeconfig: str | None = None,
                        address: str | None = None, port_forward: bool = True,
                        timeout_s: float = 15.0) -> KubeRayTarget:
        """Connect to RayCluster ``name`` on Kubernetes (KubeRay on GKE) with the ``kubernetes`` client.

        Reads the RayCluster (its worker groups give the expected slices), requires
        ``HeadPodReady``, finds ``<name>-head-svc`` and connects a Ray Client: in-cluster through
        the service's DNS name, from outside through a port-forward set up here, or at ``address``
        if given. Afterwards :meth:`snapshot` also shows expected hosts that have not joined Ray
        (``"provisioning"``, with their pod's reason) and slices KubeRay is replacing.

        Args:
            name: The RayCluster.
            namespace: Its namespace; the kubeconfig context's namespace when ``None``.
            context: A kubeconfig context; the current one when ``None``.
            kubeconfig: A kubeconfig file; ``$KUBECONFIG`` / ``~/.kube/config`` when ``None``.
            address: A Ray address to use instead (e.g. ``ray://127.0.0.1:10001`` after your own
                ``kubectl port-forward``).
            port_forward: Set up a port-forward when outside the cluster (else raise with the
                ``kubectl port-forward`` command to run).
            timeout_s: Seconds to wait for the Ray address to answer.

        Returns:
            The :class:`~raytpu_lab.cluster.kuberay_connect.KubeRayTarget` (also ``self.kuberay``).

        Raises:
            KubernetesError: No kubeconfig, unknown context, RBAC 403, RayCluster or CRD not
                found, head not ready, port-forward refused (one clear message each).
            ManifestError: The RayCluster's TPU groups break the webhook's rules.
            ConnectError: The Ray address does not answer, or Ray refuses to connect.
        """
        from raytpu_lab.cluster.kuberay_connect import resolve

        target = resolve(name, namespace=namespace, context=context, kubeconfig=kubeconfig,
                         address=address, port_forward=port_forward)
        try:
            self.connect(target.address, timeout_s=timeout_s)
        except BaseException:
            target.close()
            raise
        self.kuberay = target
        return target

    def apply(self, manifest: str | Path | Mapping[str, Any], *, namespace: str | None = None,
              context: str | None = None, kubeconfig: str | None = None) -> dict[str, Any]:
        """Validate a RayCluster manifest and create or update it on Kubernetes (server-side apply).

        Returns:
            The RayCluster as stored by the API server.

        Raises:
            ManifestError: It fails the CRD schema or the TPU rules (nothing is sent).
            KubernetesError: As :meth:`connect_kuberay`.
        """
        from raytpu_lab.cluster.kuberay_emulator import read_manifest
        from raytpu_lab.kuberay import check_manifest

        obj, source = read_manifest(manifest)
        if obj.get("kind") != "RayCluster":
            from raytpu_lab.errors import ManifestError

            raise ManifestError(f"{source} is a {obj.get('kind')}, not a RayCluster.",
                                why="apply creates RayClusters only.",
                                fix="Apply RayJobs and RayServices with kubectl apply -f.", source=source)
        check_manifest(obj, source=source)
        return self._kube(namespace, context, kubeconfig).apply(obj, namespace)

    def scale(self, group: str, slices: int, *, name: str | None = None,
              namespace: str | None = None, context: str | None = None,
              kubeconfig: str | None = None) -> list[str]:
        """Set a TPU worker group's slice count (``replicas``) on Kubernetes.

        Args:
            group: The worker group's ``groupName``.
            slices: Slices wanted (KubeRay creates or deletes whole slices).
            name: The RayCluster; the connected one (:meth:`connect_kuberay`) when ``None``.

        Returns:
            Notes on bounds widened (``maxReplicas`` / ``minReplicas``).

        Raises:
            RaytpuError: ``slices`` below 0, or no RayCluster named and none connected.
            KubernetesError: As :meth:`connect_kuberay`, or no such group.
        """
        if slices < 0:
            raise RaytpuError(f"--slices {slices} is not allowed.", why="A group has 0 or more slices.",
                              fix="Pass --slices 0 or more.")
        client, name, namespace = self._kube_target(name, namespace, context, kubeconfig, "scale")
        _, notes = client.scale(name, group, slices, namespace)
        if self.kuberay is not None:
            self.kuberay._planned = None  # read the new plan on the next snapshot
        return notes

    def delete_raycluster(self, name: str | None = None, *, yes: bool = False,
                          namespace: str | None = None, context: str | None = None,
                          kubeconfig: str | None = None) -> str:
        """Delete a RayCluster on Kubernetes (KubeRay then deletes its pods: every slice goes).

        Args:
            name: The RayCluster; the connected one when ``None``.
            yes: Confirmation; required, because this frees TPUs other people may be using.

        Returns:
            The deleted RayCluster's name.

        Raises:
            RaytpuError: Not confirmed, or no RayCluster named and none connected.
            KubernetesError: As :meth:`connect_kuberay`.
        """
        client, name, namespace = self._kube_target(name, namespace, context, kubeconfig, "delete")
        if not yes:
            raise RaytpuError(f"Not deleting RayCluster {name!r}: not confirmed.",
                              why="Deleting it stops every pod and frees its TPU slices.",
                              fix="Confirm with --yes (yes=True in Python).")
        client.delete(name, namespace)
        if self.kuberay is not None and self.kuberay.name == name:
            self.address = None
            self._drop_kuberay()
            disconnect()
        return name

    def _kube(self, namespace: str | None, context: str | None, kubeconfig: str | None) -> Any:
        from raytpu_lab.kuberay.client import KubeRayClient

        if self.kuberay is not None and context is None and kubeconfig is None:
            return self.kuberay.client
        return KubeRayClient.from_config(context=context, namespace=namespace, kubeconfig=kubeconfig)

    def _kube_target(self, name: str | None, namespace: str | None, context: str | None,
                     kubeconfig: str | None, doing: str) -> tuple[Any, str, str | None]:
        if name is None:
            if self.kuberay is None:
                raise RaytpuError(f"Cannot {doing}: which RayCluster?",
                                  why="No RayCluster was named and this session is connected to none.",
                                  fix="Name it (--cluster NAME) or connect first "
                                      "(%raytpu connect --kuberay NAME).")
            name = self.kuberay.name
            namespace = namespace or self.kuberay.namespace
        return self._kube(namespace, context, kubeconfig), name, namespace

    def _drop_kuberay(self) -> None:
        if self.kuberay is not None:
            self.kuberay.close()
            self.kuberay = None

    # -- helpers ---------------------------------------------------------------------------

    def _own_slices(self) -> set[str]:
        return {s for r in self._reservations.values() for s in r.slice_names}

    def _highlight(self, slices: set[str]) -> None:
        if self._map is not None and not getattr(self._map, "closed", False):
            self._map.set_highlight(slices)
            self.refresher.refresh_now()

    def _mark_dcn(self, groups: list[list[str]]) -> None:
        if self._map is not None and not getattr(self._map, "closed", False):
            self._map.set_dcn(groups)

    def require_connection(self, doing: str) -> None:
        """Raise unless a cluster is connected (``doing``: what needs it, e.g. "reserve a slice").

        Raises:
            NotConnectedError: No cluster connected; the message says how to connect.
        """
        self._require_connection(doing)

    def _require_connection(self, doing: str) -> None:
        if not self.connected:
            raise NotConnectedError(
                f"Cannot {doing}: no Ray cluster is connected.",
                fix="Start the local emulator (%raytpu up) or connect (%raytpu connect ADDRESS).")

    def _next_name(self) -> str:
        while True:
            name = f"r{next(self._names)}"
            if name not in self._reservations:
                return name

    def _at_exit(self) -> None:
        """Kernel exit or restart: release this session's reservations and stop the emulated
        cluster this session started with :meth:`up` (its hosts and head would otherwise stay;
        a cluster started from a shell with ``raytpu up`` is left running)."""
        self._forget_reservations()
        started, self._started = self._started, None
        if started is not None:
            # Stopped by a process of its own first: Jupyter kills a kernel that takes more
            # than a few seconds to exit or restart, which would leave the cluster half-stopped.
            emulator.down_in_background(started)
            disconnect()

    def _forget_reservations(self) -> None:
        self._close_sessions()
        for res in list(self._reservations.values()):
            if not res.detached:
                res.release()
        self._reservations.clear()


def _answers(address: str) -> bool:
    """Whether the GCS at ``address`` accepts connections (a refusal is known within 3 s)."""
    try:
        probe(address, timeout_s=3.0)
    except ConnectError:
        return False
    return True


def _require_positive(option: str, value: float) -> None:
    if not (value > 0 and math.isfinite(value)):  # nan and inf too: a wait must end
        raise RaytpuError(f"--{option} {value} is not allowed.",
                          why=f"{option} must be a finite number above 0.",
                          fix=f"Pass a positive --{option}.")


def _alive_nodes() -> int:
    return sum(1 for n in ray.nodes() if n.get("Alive"))


_LAB: Lab | None = None


def get_lab() -> Lab:
    """The kernel's one :class:`Lab` (created on first use)."""
    global _LAB
    if _LAB is None:
        _LAB = Lab()
        atexit.register(_LAB._at_exit)
    return _LAB
