"""Starting the Ray nodes of an emulated cluster, with retries (helpers of :mod:`.emulator`).

Each node is started with ``ray start`` *without* ``--block``: ``ray start`` starts the node's
daemons (raylet, which starts the dashboard agent and the runtime-env agent; on the head also the
GCS, the dashboard and the one log monitor of the machine), waits until the raylet registered
with the GCS, and exits. The daemons stay in the process group ``ray start`` was given (a new
session per node), so the node is tracked by that process-group id: no Python parent per host
(~85 MB each with ``--block``). Hosts run no log monitor (Ray's rule: one per physical machine,
as ``ray/cluster_utils.py`` does) and Ray prestarts no idle worker on them when a driver connects
(``RAY_prestart_worker_first_driver=0``).

A node whose ``ray start`` fails is started again with fresh ports (bounded); a node that dies
after it started, or a head that dies while hosts start, ends the start at once with its log tail
and the likely cause. How a starting node is doing is read by :mod:`._node_checks`; its
environment comes from :mod:`._node_environment`, its CPU priority from :mod:`._priority`.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from raytpu_lab.advice import opt
from raytpu_lab.cluster._addresses import free_ports
from raytpu_lab.cluster._launcher import Launcher
from raytpu_lab.cluster._node_checks import (
    aborts,
    likely_cause,
    missed_window,
    node_error,
    raylet_aborted,
    raylet_of,
    registered,
)
from raytpu_lab.cluster._node_environment import node_environment
from raytpu_lab.cluster._priority import START_NICE, normal_priority
from raytpu_lab.cluster._process_groups import group_alive, kill_strays, pid_alive, signal_group
from raytpu_lab.errors import EmulatorError

__all__ = ["NodeSpec", "launcher", "start_head", "start_hosts"]

_OBJECT_STORE_BYTES = 128 * 1024 * 1024  # per node; Ray's minimum is 75 MiB
_MAX_STARTING = 4
_START_ATTEMPTS = 8
_HEAD_ATTEMPTS = 4


@dataclass
class NodeSpec:
    """One node to start: its log label, environment and ``ray start`` arguments (ports apart)."""

    label: str
    env: dict[str, str]
    args: list[str]
    ip: str
    pgid: int = 0
    raylet_pid: int = 0
    aborts_before: int = 0


def _port_flags(ip: str, head: bool) -> list[str]:
    # Every port explicit and free on the node's own address: several clusters on one machine
    # otherwise race for Ray's defaults (52365 for the dashboard agent: a second head's Jobs API
    # then answers "No available agent to submit job").
    names = ["dashboard-agent-listen-port", "dashboard-agent-grpc-port", "node-manager-port",
             "object-manager-port", "metrics-export-port", "runtime-env-agent-port"]
    return [f"--{n}={p}" for n, p in zip(names, free_ports(len(names), ip), strict=True)]


def launcher(folder: Path) -> Launcher:
    """A launcher for this cluster's nodes (close it when the start is over)."""
    return Launcher(node_environment(folder, dict(os.environ)))


def _launch(run: Launcher, folder: Path, spec: NodeSpec, extra: list[str]) -> int:
    argv = ["start", "--disable-usage-stats", f"--object-store-memory={_OBJECT_STORE_BYTES}",
            "--min-worker-port=0", "--max-worker-port=0", f"--node-ip-address={spec.ip}",
            *spec.args, *extra]
    spec.aborts_before = aborts(spec)
    try:
        # A new session per node: its daemons share a process group that `down` signals at once.
        launch_id = run.start(node_environment(folder, spec.env), argv,
                              folder / "logs" / f"{spec.label}.log", nice=START_NICE)
    except RuntimeError as err:
        raise EmulatorError(f"Could not start emulated node {spec.label}: {err}.",
                            why=likely_cause(""), fix="Run `up` again.") from err
    spec.pgid = run.pid(launch_id)
    return launch_id


def start_head(run: Launcher, folder: Path, spec: NodeSpec, deadline: float,
               ports: Callable[[], list[str]]) -> NodeSpec:
    """Start the head, up to ``_HEAD_ATTEMPTS`` times with fresh ports (``ports()`` gives the
    GCS, dashboard and client port flags); returns ``spec`` with its process group set.

    Raises:
        EmulatorError: Every attempt failed, or ``deadline`` (``time.monotonic()``) passed; the
            message has the last attempt's log tail and the likely cause.
    """
    for attempt in range(1, _HEAD_ATTEMPTS + 1):
        launch = _launch(run, folder, spec, [*ports(), *_port_flags(spec.ip, head=True)])
        while run.poll(launch) is None and time.monotonic() < deadline \
                and not raylet_aborted(spec):
            time.sleep(0.1)
        code = run.poll(launch)
        if code is None:  # its raylet aborted (or the deadline passed): `ray start` would hang
            signal_group(spec.pgid, signal.SIGKILL)
            code = 1
        if code != 0 and missed_window(folder, spec):
            while not registered(spec) and raylet_of(spec.pgid) \
                    and time.monotonic() < deadline:
                time.sleep(0.2)
            code = 0 if registered(spec) else code
        if code == 0:
            spec.raylet_pid = raylet_of(spec.pgid)
            return spec
        signal_group(spec.pgid, signal.SIGKILL)
        if time.monotonic() >= deadline:
            raise node_error(folder, spec, f"did not start before the timeout (attempt {attempt})",
                              timed_out=True)
        if attempt == _HEAD_ATTEMPTS:
            raise node_error(folder, spec, f"failed to start {attempt} times (exit code "
                                            f"{code})")
        kill_strays(str(folder / "ray"))
    raise AssertionError("not reached")


def start_hosts(run: Launcher, folder: Path, head: NodeSpec, nodes: list[NodeSpec], deadline: float,
                progress: Callable[[int, int], None] | None = None) -> None:
    """Start every host node, at most ``_MAX_STARTING`` at once; sets each one's process group.

    ``ray start`` gives a node a fixed 30 s to register with the GCS; on a busy machine its
    raylet, waiting for its dashboard agent, can miss it: such a node is left to finish (its
    raylet lives on) and waited for. A node whose start fails otherwise is started again with
    fresh ports, up to ``_START_ATTEMPTS`` times, and fewer nodes start at once from then on.
    ``progress(hosts up, hosts expected)`` is called as hosts come up.

    Raises:
        EmulatorError: A node failed ``_START_ATTEMPTS`` times, a started node or the head died,
            or ``deadline`` passed; with log tails and the likely cause. Started nodes are left
            for the caller to stop (their process groups are set).
    """
    launches: dict[int, int] = {}
    attempts = [0] * len(nodes)
    pending = list(range(len(nodes)))
    in_flight: list[int] = []
    done: list[int] = []
    max_starting = _starting_at_once()
    next_check = 0.0
    if progress:
        progress(0, len(nodes))
    while pending or in_flight:
        while pending and len(in_flight) < max_starting:
            i = pending.pop(0)
            attempts[i] += 1
            launches[i] = _launch(run, folder, nodes[i], _port_flags(nodes[i].ip, head=False))
            in_flight.append(i)
        time.sleep(0.2)
        # The checks that read /proc or log files run once a second: on 2 cores, scanning every
        # process five times a second took CPU from the nodes being started.
        thorough = time.monotonic() >= next_check
        if thorough:
            next_check = time.monotonic() + 1.0
        if not pid_alive(head.raylet_pid) or thorough and not group_alive(head.pgid):
            raise node_error(folder, head, "died while the hosts were starting")
        for i in done if thorough else []:
            if not pid_alive(nodes[i].raylet_pid):
                raise node_error(folder, nodes[i], "died after it started")
        still = []
        for i in in_flight:
            code = run.poll(launches[i])
            if code is None and thorough and raylet_aborted(nodes[i]):
                code = 1  # `ray start` would wait for the dead raylet forever: start it again
            if code is not None and code != 0 and missed_window(folder, nodes[i]):
                # `ray start` gave up after its fixed 30 s, but the raylet lives on, waiting for
                # its agents: let it finish registering rather than start it all again.
                if registered(nodes[i]):
                    code = 0
                elif raylet_of(nodes[i].pgid):
                    still.append(i)
                    continue
            if code is None:
                still.append(i)
            elif code == 0:
                nodes[i].raylet_pid = raylet_of(nodes[i].pgid)
                normal_priority(nodes[i])
                done.append(i)
                if progress:
                    progress(len(done), len(nodes))
            elif attempts[i] < _START_ATTEMPTS:
                signal_group(nodes[i].pgid, signal.SIGKILL)
                pending.insert(0, i)
                max_starting = max(1, max_starting // 2)
            else:
                raise node_error(folder, nodes[i], f"failed to start {attempts[i]} times (exit "
                                                    f"code {code})")
        in_flight = still
        if (pending or in_flight) and time.monotonic() > deadline:
            left = [nodes[i].label for i in in_flight + pending]
            raise EmulatorError(
                f"{len(left)} emulated node(s) did not start before the timeout: "
                f"{', '.join(left[:8])}{' ...' if len(left) > 8 else ''} ({len(done)} of "
                f"{len(nodes)} hosts were up).",
                why="None of them failed; they were still starting. " + likely_cause(""),
                fix=("Pass a longer timeout (", opt("timeout", "SECONDS"), "), or start fewer slices."))


def _starting_at_once() -> int:
    """How many nodes to start at once: up to ``_MAX_STARTING`` on an idle machine, fewer as its
    load grows (Ray 2.60's raylet aborts if its dashboard agent, a Python process importing
    Ray, has not written its port within a fixed time; agents starting together on a busy
    machine miss it)."""
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0]
    if load < cores:
        return _MAX_STARTING
    return 2 if load < 2 * cores else 1


