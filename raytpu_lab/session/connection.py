"""The session's connection: which Ray cluster (emulated, at an address, or a RayCluster on
Kubernetes), starting and stopping emulated ones, and what happens at kernel exit."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import ray

from raytpu_lab import _ray_private
from raytpu_lab._checks import require_positive
from raytpu_lab.advice import cmd
from raytpu_lab.cluster import emulator
from raytpu_lab.cluster.connect import connect, disconnect, probe, wait_for_nodes
from raytpu_lab.errors import ConnectError, EmulatorError, InvalidTopologyError
from raytpu_lab.options import DEFAULT_TPU
from raytpu_lab.session.reader import StateReader
from raytpu_lab.tpu.topology import parse_spec

__all__ = ["Connection", "default_address"]

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
                           why=listed, fix=("Give its address: ", cmd("connect", "ADDRESS"), "."))
    raise ConnectError("No Ray cluster to connect to: no address given, RAY_ADDRESS is not set "
                       "and no emulated cluster runs on this machine.",
                       fix=("Give the address (", cmd("connect", "HOST:6379"), ", or ray://HOST:10001), "
                            "connect to a RayCluster on Kubernetes (", cmd("connect-kuberay", "NAME"),
                            "), or start an emulated cluster (", cmd("up"), ")."))


def _answers(address: str) -> bool:
    """Whether the GCS at ``address`` accepts connections (a refusal is known within 3 s)."""
    try:
        probe(address, timeout_s=3.0)
    except ConnectError:
        return False
    return True


class Connection:
    """Which cluster this session's driver is connected to, and the emulated one it started.

    Args:
        reader: Counts live nodes while an emulated cluster's hosts join.
        on_switch: Called once a new address answers, just before the driver connects to it
            (the session drops what belonged to the cluster it leaves).

    Attributes:
        address: The Ray address connected to, or ``None``.
        cluster: The emulated cluster at that address, or ``None``.
        started: The emulated cluster :meth:`up` started (until :meth:`down`), or ``None``.
    """

    def __init__(self, reader: StateReader, on_switch: Callable[[], None] = lambda: None) -> None:
        self.reader = reader
        self.on_switch = on_switch
        self.address: str | None = None
        self.cluster: emulator.EmulatedCluster | None = None
        self.started: emulator.EmulatedCluster | None = None

    @property
    def connected(self) -> bool:
        """Whether this process is a Ray driver connected through this session."""
        return self.address is not None and ray.is_initialized()

    def up(self, tpu: str | Sequence[str] = DEFAULT_TPU, slices: int = 2, *,
           name: str | None = None,
           timeout_s: float = 180.0, manifest: str | Path | Mapping[str, Any] | None = None,
           progress: Callable[[int, int], None] | None = None) -> emulator.EmulatedCluster:
        """Start a local emulated TPU cluster and connect to it.

        Args:
            tpu: ``"<version>:<topology>"``, e.g. ``"v6e:4x4"``, ``"v4:2x2x2"``, ``"v5e:2x2"``,
                or several such shapes (a mixed cluster, e.g. ``["v6e:4x4", "v4:2x2x2"]``).
            slices: Number of slices of each shape.
            name: Cluster name (one emulated cluster per name); ``"raytpu"``, or the manifest's
                ``metadata.name``, when ``None``.
            timeout_s: Seconds to wait for every node to start.
            manifest: A RayCluster manifest (file path or dict) to emulate instead of ``tpu`` /
                ``slices``: its TPU worker groups, slices, hosts and container env
                (:mod:`raytpu_lab.kuberay.emulate`).
            progress: Called as ``progress(hosts up, hosts expected)`` while hosts start.

        An emulated cluster of this name that already runs with at least the slices asked for
        is joined instead: nothing is started, and :meth:`down` leaves it running
        (:attr:`started` is ``None``).

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
            from raytpu_lab.kuberay.emulate import up_from_manifest

            cluster = up_from_manifest(manifest, name=name, timeout_s=timeout_s,
                                       progress=progress)
        else:
            shapes = [tpu] if isinstance(tpu, str) else list(tpu)
            if not shapes:
                raise InvalidTopologyError("No slice shape given to start.",
                                           fix='Give at least one, e.g. "v6e:4x4".')
            for shape in shapes:
                parse_spec(shape)
            specs = [(shape, slices) for shape in shapes]

            def start_fresh() -> emulator.EmulatedCluster:
                return emulator.up(specs, name=name or emulator.DEFAULT_NAME,
                                   timeout_s=timeout_s, progress=progress)

            running = emulator.find(name or emulator.DEFAULT_NAME)
            if running is not None and not _answers(running.address):
                # Left half-stopped (a kernel killed while it stopped its cluster): its head no
                # longer answers, so nobody can be using it; stop what is left, start anew.
                running.down(timeout_s=2.0)
                running = None
            if running is not None and running.holds(specs):
                # Re-running a notebook's `up` cell (after a kernel restart, or many notebooks
                # in one test session) joins the cluster that already has what it asks for.
                cluster, started = running, False
            else:
                cluster = start_fresh()
        try:
            try:
                self.connect(cluster.address)
            except ConnectError:
                if started or manifest is not None or _answers(cluster.address):
                    raise
                # The cluster joined stopped answering between the check above and the connect
                # (a half-stopped one whose last processes were still going): start anew.
                cluster.down(timeout_s=2.0)
                cluster, started = start_fresh(), True
                self.connect(cluster.address)
            expected = len(cluster.hosts) + 1
            seen = wait_for_nodes(self.reader.alive_nodes, expected, _NODE_JOIN_TIMEOUT_S)
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
        self.started = cluster if started else None
        return cluster

    def connect(self, address: str | None = None, *, timeout_s: float = 15.0) -> str:
        """Connect to an existing Ray cluster (GCS ``HOST:PORT`` or ``ray://HOST:PORT``); the
        reservations of the cluster left are given back (detached ones stay).

        Args:
            address: Where the cluster is. ``None``: ``$RAY_ADDRESS`` if set, else the one
                emulated cluster running on this machine.
            timeout_s: Seconds to wait for the cluster to answer.

        Returns:
            The address connected to.

        Raises:
            ConnectError: No address was given and none could be found (or several emulated
                clusters run), nothing answered within ``timeout_s`` seconds, or Ray refused.
            RaytpuError: ``timeout_s`` is not a finite number above 0.
        """
        require_positive("timeout", timeout_s)
        address = address or default_address()
        probe(address, timeout_s=timeout_s)  # fail before dropping the current connection
        self.on_switch()
        found = [c for c in emulator.running()
                 if address in (c.address, f"ray://127.0.0.1:{c.client_port}")]
        if found:
            _ray_private.enable_token_auth()  # emulated clusters run with Ray token auth
        connect(address, timeout_s=timeout_s, ship_package=not found)
        self.address = address
        self.cluster = found[0] if found else None
        return address

    def check_stoppable(self, name: str | None) -> emulator.EmulatedCluster | None:
        """The running emulated cluster ``name`` (``None``: none asked for).

        Raises:
            EmulatorError: ``name`` names no running emulated cluster.
        """
        if name is None:
            return None
        named = emulator.find(name)
        if named is None:
            others = [c.name for c in emulator.running()]
            raise EmulatorError(
                f"No emulated cluster named {name!r} is running.",
                why="Nothing was stopped or disconnected.",
                fix=(f"Name one that runs: {', '.join(others)}." if others
                     else "No emulated cluster runs on this machine."))
        return named

    def disconnect(self, *, forget_cluster: bool = True) -> None:
        """Disconnect the driver; the emulated cluster started stays :attr:`started`
        (``forget_cluster``: also forget :attr:`cluster`)."""
        self.address = None
        if forget_cluster:
            self.cluster = None
        disconnect()

    def down(self, named: emulator.EmulatedCluster | None = None) -> str | None:
        """Disconnect and stop the emulated cluster this session started, and ``named`` too.

        Returns:
            The name of the emulated cluster stopped, or ``None`` if none was.
        """
        started, self.started = self.started, None
        self.disconnect()
        stopped = None
        for cluster in (started, named):
            if cluster is not None and cluster.is_running():
                cluster.down()
                stopped = stopped or cluster.name
        return stopped

    def at_exit(self) -> None:
        """Kernel exit or restart: stop the emulated cluster :meth:`up` started (a cluster
        started from a shell with ``raytpu up`` is left running)."""
        started, self.started = self.started, None
        if started is not None:
            # Stopped by a process of its own first: Jupyter kills a kernel that takes more
            # than a few seconds to exit or restart, which would leave the cluster half-stopped.
            emulator.down_in_background(started)
            disconnect()
