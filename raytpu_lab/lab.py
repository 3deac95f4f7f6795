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
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raytpu_lab.cluster import emulator
from raytpu_lab.options import DEFAULT_TPU
from raytpu_lab.reservations.check_report import CheckReport
from raytpu_lab.reservations.service import ReservationService
from raytpu_lab.reservations.slices import Reservation
from raytpu_lab.reservations.spmd import CellResult, SliceSession
from raytpu_lab.serve.service import ServeService
from raytpu_lab.session._forward import forwarded as _forwarded
from raytpu_lab.session.connection import Connection
from raytpu_lab.session.hosts import HostSessions
from raytpu_lab.session.kuberay_control import KubeRayControl
from raytpu_lab.session.map_feed import MapFeed
from raytpu_lab.session.reader import SnapshotContext, StateReader
from raytpu_lab.session.serving import ServingMethods
from raytpu_lab.session.training import TrainingMethods
from raytpu_lab.state.snapshot import ClusterSnapshot
from raytpu_lab.train.service import Runs

if TYPE_CHECKING:
    from raytpu_lab.kuberay.connect import KubeRayTarget
    from raytpu_lab.reservations.info import ReservationInfo
    from raytpu_lab.widgets.status import StatusView
    from raytpu_lab.widgets.topology_map import TopologyMap

__all__ = ["Lab", "Session", "get_lab", "use_session"]


class Session(TrainingMethods, ServingMethods):
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
        connection, reservation_service, hosts, kube, feed, runs, serving: The services.
    """

    def __init__(self, reader: StateReader | None = None) -> None:
        self.reader = reader or StateReader(connected=lambda: self.connected)
        self.reader.context = self._snapshot_context  # what this session adds to Ray's view
        self.connection = Connection(self.reader, on_switch=self._leave_cluster)
        self.reservation_service = ReservationService(self.reader, on_release=self._releasing)
        self.hosts = HostSessions(self.reservation_service)
        self.kube = KubeRayControl(self.connect)
        self.feed = MapFeed(self.snapshot, own_slices=self.reservation_service.own_slices)
        self.serving = ServeService(self.reservation_service, self.reader,
                                    close_hosts=self.hosts.close, on_served=self.feed.serving_placed,
                                    on_deleted=self.feed.run_ended)
        # Late-bound: tests (and subclasses) that replace snapshot or the connection check reach it.
        self.runs = Runs(lambda: self.snapshot(), lambda doing: self.require_connection(doing),
                         reservation=self.reservation_service.get,
                         held=lambda: list(self.reservation_service.held),
                         release_hosts=self.hosts.close, on_placed=self.feed.run_placed,
                         raw_state=lambda: self.reader.raw(),
                         on_ended=self.feed.run_ended)

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

    def up(self, tpu: str | Sequence[str] = DEFAULT_TPU, slices: int = 2, *,
           name: str | None = None,
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
        self.feed.stop("disconnected (down)")
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
        self.feed.highlight(set(res.slice_names))
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
        self.feed.highlight(set(res.slice_names))
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

    def check(self, name: str | None = None, *, timeout_s: float = 60.0) -> CheckReport:
        """Smoke-test the TPU hosts of reservation ``name`` (``None``: of every idle intact slice,
        each reserved for the check and released after): per host JAX's global and local device
        counts, process index, and a ``psum`` over every device blocked on with
        ``block_until_ready``, with its time; a host that errs or is silent for ``timeout_s``
        seconds is named. See :meth:`raytpu_lab.session.hosts.HostSessions.check`."""
        return self.hosts.check(name, timeout_s=timeout_s)

    # -- training: see raytpu_lab.session.training (every run goes through self.runs) --

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

    # -- what the services and the training section share ----------------------------------

    def require_connection(self, doing: str) -> None:
        """Raise unless a cluster is connected (``doing``: what needs it, e.g. "reserve a slice").

        Raises:
            NotConnectedError: No cluster connected; the message says how to connect.
        """
        self.reader.require(doing)

    def _snapshot_context(self) -> SnapshotContext:
        cluster = self.connection.cluster
        kube_expected, planned = self.kube.expectation()
        expected = (cluster.expected_hosts if cluster else None) or kube_expected
        return SnapshotContext(expected_hosts=expected, jobs=self.feed.jobs, planned=planned)

    def _releasing(self, name: str) -> None:
        """Before reservation ``name``'s slices are given back: stop what uses its chips."""
        self.hosts.close(name)
        self.serving.delete_for(name)

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
