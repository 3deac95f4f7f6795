"""Starting and stopping the Ray nodes of an emulated cluster (helpers of :mod:`.emulator`).

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
and the likely cause.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from raytpu_lab.cluster._launcher import Launcher
from raytpu_lab.errors import EmulatorError

__all__ = ["AUTH_ENV", "FOLDER_ENV", "NodeSpec", "start_head", "start_hosts", "free_ports",
           "loopback_prefix", "normal_priority", "group_alive", "signal_group", "wait_groups_gone",
           "kill_strays", "likely_cause", "FORKSERVER_ENV", "AGENT_PIPE_ENV",
           "start_agent_forkserver", "agent_forkserver_ready", "forkserver_socket"]

AUTH_ENV = {"RAY_AUTH_MODE": "token"}
"""Environment every emulated node runs with, and a driver needs to connect: Ray token auth with
the token in Ray's default file ``~/.ray/auth_token`` (Ray listens on every interface, so a local
cluster without a token would take code from anyone on the network)."""

FOLDER_ENV = "RAYTPU_EMULATED_CLUSTER"
"""Set to the cluster's folder in every process of an emulated node: Ray's daemons rename
themselves (``ray::DashboardAgent``) and can leave their process group, so the stray sweep finds
them by this variable rather than by command line."""

_REGISTRATION_TIMEOUT_MARK = "timed out during startup"
_RAYLET_STARTED = re.compile(r"Raylet of id, [0-9a-f]+ started")
_OBJECT_STORE_BYTES = 128 * 1024 * 1024  # per node; Ray's minimum is 75 MiB
_MAX_STARTING = 4
_START_ATTEMPTS = 8
_START_NICE = -10
"""CPU priority of a node's processes while it starts (where we may raise it, i.e. as root):
Ray 2.60's raylet aborts when its dashboard agent, a Python process importing Ray, has not
written its port within a fixed ~15 s, which a busy machine makes it miss; once the node has
registered its priority is set back to normal (:func:`normal_priority`)."""
_HEAD_ATTEMPTS = 4

# Ray's own start-up waits, raised for emulated nodes where Ray's configuration lets us (Ray reads
# RAY_<name> from the environment of each daemon):
# - agent_register_timeout_ms: how long the raylet waits for its dashboard agent and runtime-env
#   agent to come up (busy machines: the agents are Python processes importing Ray);
# - gcs_rpc_server_reconnect_timeout_s: how long a raylet keeps trying to reach a busy GCS.
# Not configurable in Ray 2.60: `ray start`'s fixed 30 s node-registration window
# (ray/_private/node.py), which includes the raylet waiting for its dashboard agent to import Ray;
# a node that misses it keeps starting (its raylet lives on) and is waited for until its raylet
# says it started; only a node whose raylet died is started again with fresh ports.
_RAY_WAITS = {
    # - raylet_start_wait_time_s: the node-registration wait Ray's GCS names when a node is late
    #   ("Try increase the RAY_raylet_start_wait_time_s config").
    # Not raised by any of these in Ray 2.60 (measured): the raylet's fixed wait for its dashboard
    # agent to write its port (NodeManager::WaitForDashboardAgentPorts aborts with "Check
    # failed"); against that, fewer nodes start at once on a loaded machine (_starting_at_once).
    "RAY_raylet_start_wait_time_s": "600",
    "RAY_agent_register_timeout_ms": "300000",
    "RAY_gcs_rpc_server_reconnect_timeout_s": "120",
    # - worker_register_timeout_seconds: how long a raylet waits for a new Python worker to
    #   register (default 60 s): 64 hosts' workers all importing Ray at once on 2 cores (a
    #   per-host cell on a v6e-256) need longer.
    "RAY_worker_register_timeout_seconds": "300",
    # - health_check_failure_threshold: missed GCS health checks (every 3 s, 10 s timeout) before
    #   a node is declared dead (default 5); raylets starved by such a start miss a few. A killed
    #   host refuses the check at once, so it is still found dead within ~30 s.
    "RAY_health_check_failure_threshold": "10",
    # No idle worker prestarted on every node when a driver connects (~43 MB a host).
    "RAY_prestart_worker_first_driver": "0",
}


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


def node_environment(folder: Path, env: dict[str, str]) -> dict[str, str]:
    """``env`` plus what every process of an emulated node runs with.

    ``PATH`` starts with this interpreter's folder, so ``python`` in a job's entrypoint (KubeRay's
    RayJob samples say ``python script.py``) is the Python that runs the cluster, as a TPU pod's
    image has one Python with Ray, even when the cluster was started without activating a venv."""
    bindir = os.path.dirname(sys.executable)
    path = env.get("PATH", os.defpath)
    if path.split(os.pathsep)[0] != bindir:
        path = os.pathsep.join([bindir, path])
    return {"RAY_USAGE_STATS_ENABLED": "0", **env, "PATH": path, **AUTH_ENV, **_RAY_WAITS,
            FOLDER_ENV: str(folder)}


FORKSERVER_ENV = "RAYTPU_AGENT_FORKSERVER"
"""Set on emulated hosts to the cluster's agent fork server socket (``_agent_forkserver.py``)."""

AGENT_PIPE_ENV = {"RAY_enable_pipe_based_agent_to_parent_health_check": "1"}
"""Ray's pipe-based agent health check on hosts: the raylet puts a pipe on each agent's standard
input and the agent exits when it reads EOF, so an agent forked by the fork server (not the
raylet's child) still ends with its raylet (Ray's other check compares the agent's parent pid)."""


def start_agent_forkserver(folder: Path) -> int:
    """Start the cluster's agent fork server (its own session); returns its process-group id.

    Hosts started once :func:`agent_forkserver_ready` their agents forked from it; before that,
    or if it fails, their agents start the ordinary way."""
    env = {**node_environment(folder, dict(os.environ)), **AGENT_PIPE_ENV}
    with open(folder / "logs" / "agent-forkserver.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "raytpu_lab.cluster._agent_forkserver",
             str(forkserver_socket(folder)), str(folder)],
            env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    # Its new session's autogroup at our own CPU share, as the nodes get (normal_priority).
    with contextlib.suppress(OSError), open(f"/proc/{proc.pid}/autogroup", "w") as group:
        group.write(_own_autogroup_nice())
    return proc.pid


def forkserver_socket(folder: Path) -> Path:
    """The agent fork server's socket in the cluster's folder."""
    return folder / "agents.sock"


def agent_forkserver_ready(folder: Path, pgid: int, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` seconds for the fork server to listen; ``False`` if it ended."""
    deadline = time.monotonic() + timeout_s
    while not forkserver_socket(folder).exists():
        if time.monotonic() >= deadline or not group_alive(pgid):
            return False
        time.sleep(0.1)
    return True


def launcher(folder: Path) -> Launcher:
    """A launcher for this cluster's nodes (close it when the start is over)."""
    return Launcher(node_environment(folder, dict(os.environ)))


def _launch(run: Launcher, folder: Path, spec: NodeSpec, extra: list[str]) -> int:
    argv = ["start", "--disable-usage-stats", f"--object-store-memory={_OBJECT_STORE_BYTES}",
            "--min-worker-port=0", "--max-worker-port=0", f"--node-ip-address={spec.ip}",
            *spec.args, *extra]
    spec.aborts_before = _aborts(spec)
    try:
        # A new session per node: its daemons share a process group that `down` signals at once.
        launch_id = run.start(node_environment(folder, spec.env), argv,
                              folder / "logs" / f"{spec.label}.log", nice=_START_NICE)
    except RuntimeError as err:
        raise EmulatorError(f"Could not start emulated node {spec.label}: {err}.",
                            why=likely_cause(""), fix="Run `up` again.") from err
    spec.pgid = run.pid(launch_id)
    return launch_id


def _aborts(spec: NodeSpec) -> int:
    """Raylet aborts (Ray's "Check failed" with a stack trace) logged in the node's temp dir.

    Every launch of a node shares one session name (Ray derives it in the launcher, before the
    fork), so a later attempt's raylet writes ``raylet.1.out`` beside the first one's."""
    temp = next((a.split("=", 1)[1] for a in spec.args if a.startswith("--temp-dir=")), "")
    count = 0
    for out in Path(temp).glob("session_*/logs/raylet*.out") if temp else []:
        try:
            count += out.read_text(errors="replace").count("*** StackTrace Information ***")
        except OSError:
            continue
    return count


def _raylet_aborted(spec: NodeSpec) -> bool:
    """Whether this launch's raylet aborted: `ray start` then waits for it forever, so the
    launch is given up at once."""
    return _aborts(spec) > spec.aborts_before


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
                and not _raylet_aborted(spec):
            time.sleep(0.1)
        code = run.poll(launch)
        if code is None:  # its raylet aborted (or the deadline passed): `ray start` would hang
            signal_group(spec.pgid, signal.SIGKILL)
            code = 1
        if code != 0 and _missed_window(folder, spec):
            while not _registered(spec) and _raylet_of(spec.pgid) \
                    and time.monotonic() < deadline:
                time.sleep(0.2)
            code = 0 if _registered(spec) else code
        if code == 0:
            spec.raylet_pid = _raylet_of(spec.pgid)
            return spec
        signal_group(spec.pgid, signal.SIGKILL)
        if time.monotonic() >= deadline:
            raise _node_error(folder, spec, f"did not start before the timeout (attempt {attempt})",
                              timed_out=True)
        if attempt == _HEAD_ATTEMPTS:
            raise _node_error(folder, spec, f"failed to start {attempt} times (exit code "
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
        if not _pid_alive(head.raylet_pid) or thorough and not group_alive(head.pgid):
            raise _node_error(folder, head, "died while the hosts were starting")
        for i in done if thorough else []:
            if not _pid_alive(nodes[i].raylet_pid):
                raise _node_error(folder, nodes[i], "died after it started")
        still = []
        for i in in_flight:
            code = run.poll(launches[i])
            if code is None and thorough and _raylet_aborted(nodes[i]):
                code = 1  # `ray start` would wait for the dead raylet forever: start it again
            if code is not None and code != 0 and _missed_window(folder, nodes[i]):
                # `ray start` gave up after its fixed 30 s, but the raylet lives on, waiting for
                # its agents: let it finish registering rather than start it all again.
                if _registered(nodes[i]):
                    code = 0
                elif _raylet_of(nodes[i].pgid):
                    still.append(i)
                    continue
            if code is None:
                still.append(i)
            elif code == 0:
                nodes[i].raylet_pid = _raylet_of(nodes[i].pgid)
                normal_priority(nodes[i])
                done.append(i)
                if progress:
                    progress(len(done), len(nodes))
            elif attempts[i] < _START_ATTEMPTS:
                signal_group(nodes[i].pgid, signal.SIGKILL)
                pending.insert(0, i)
                max_starting = max(1, max_starting // 2)
            else:
                raise _node_error(folder, nodes[i], f"failed to start {attempts[i]} times (exit "
                                                    f"code {code})")
        in_flight = still
        if (pending or in_flight) and time.monotonic() > deadline:
            left = [nodes[i].label for i in in_flight + pending]
            raise EmulatorError(
                f"{len(left)} emulated node(s) did not start before the timeout: "
                f"{', '.join(left[:8])}{' ...' if len(left) > 8 else ''} ({len(done)} of "
                f"{len(nodes)} hosts were up).",
                why="None of them failed; they were still starting. " + likely_cause(""),
                fix="Pass a longer timeout (--timeout SECONDS), or start fewer slices.")


def normal_priority(spec: NodeSpec) -> None:
    """Set a started node's processes back to normal CPU priority (see ``_START_NICE``): its
    process group, its raylet's descendants (workers started later inherit the raylet's) and its
    session's autogroup. Normal is the priority of the process starting the cluster (a CI job
    or a user's ``nice make test`` may run above 0), not 0."""
    normal = os.getpriority(os.PRIO_PROCESS, 0)
    with contextlib.suppress(OSError):
        if spec.pgid > 0:
            os.setpriority(os.PRIO_PGRP, spec.pgid, normal)
    if spec.raylet_pid <= 0:
        return
    try:
        raylet = psutil.Process(spec.raylet_pid)
        procs = [raylet, *raylet.children(recursive=True)]
    except psutil.Error:
        return
    for proc in procs:
        with contextlib.suppress(psutil.Error, OSError):
            proc.nice(normal)
    with contextlib.suppress(OSError), open(f"/proc/{spec.raylet_pid}/autogroup", "w") as group:
        group.write(_own_autogroup_nice())


def _own_autogroup_nice() -> str:
    """This process's autogroup nice ("0" where the kernel has no autogroups)."""
    try:
        return Path("/proc/self/autogroup").read_text().split()[-1]
    except (OSError, IndexError):
        return "0"


def _missed_window(folder: Path, spec: NodeSpec) -> bool:
    log = folder / "logs" / f"{spec.label}.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    return _REGISTRATION_TIMEOUT_MARK in text[-3000:]


def _registered(spec: NodeSpec) -> bool:
    """Whether the node's raylet says it started (it registered with the GCS just before)."""
    temp = next((a.split("=", 1)[1] for a in spec.args if a.startswith("--temp-dir=")), "")
    out = Path(temp) / "session_latest" / "logs" / "raylet.out"
    try:
        return _RAYLET_STARTED.search(out.read_text(errors="replace")) is not None
    except OSError:
        return False


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


def _raylet_of(pgid: int) -> int:
    """The raylet's pid in a node's process group (0 if none: the node is gone)."""
    for proc in psutil.process_iter(["name"]):
        try:
            if proc.info["name"] == "raylet" and os.getpgid(proc.pid) == pgid:
                return int(proc.pid)
        except (psutil.Error, OSError):
            continue
    return 0


def _node_error(folder: Path, spec: NodeSpec, what: str, timed_out: bool = False) -> EmulatorError:
    log = folder / "logs" / f"{spec.label}.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    raylet = _raylet_text(folder, spec)
    tail = "\n".join(text.strip().splitlines()[-12:])
    raylet_tail = "\n".join(line for line in raylet.strip().splitlines()[-6:])
    cause = likely_cause(text + "\n" + raylet)
    why = f"{cause}\nLast lines of {log}:\n{tail}"
    if raylet_tail:
        why += f"\nLast lines of its raylet.out:\n{raylet_tail}"
    return EmulatorError(
        f"Emulated node {spec.label} {what}.", why=why,
        fix="Pass a longer timeout (--timeout SECONDS) or start fewer slices." if timed_out or
            "busy" in cause else "Fix the cause above and run `up` again.")


def _raylet_text(folder: Path, spec: NodeSpec) -> str:
    temp = next((a.split("=", 1)[1] for a in spec.args if a.startswith("--temp-dir=")), "")
    if not temp:
        return ""
    found = sorted(Path(temp).glob("session_*/logs/raylet.out"), key=lambda p: p.stat().st_mtime)
    return found[-1].read_text(errors="replace")[-20000:] if found else ""


def likely_cause(text: str) -> str:
    """The likely cause of a failed or slow node start, from its logs and the machine's state."""
    load = os.getloadavg()[0]
    cores = os.cpu_count() or 1
    free_gib = psutil.virtual_memory().available / 2**30
    busy = f"(load average {load:.1f} on {cores} cores, {free_gib:.1f} GiB memory free)"
    if "Usage: ray start" in text:
        return "Likely cause: `ray start` refused an argument (see the log below)."
    if "timed out during startup" in text:
        return f"Likely cause: the node missed Ray's fixed 30 s registration window: a busy machine {busy}."
    if "Timed out waiting for file" in text or "dashboard.err" in text \
            or "WaitForDashboardAgentPorts" in text:
        return f"Likely cause: the node's Python agents started too slowly: a busy machine {busy}."
    if "Address already in use" in text or "bind" in text.lower() and "fail" in text.lower():
        return "Likely cause: a port was taken between choosing it and binding it."
    if free_gib < 1.0:
        return f"Likely cause: memory is short {busy}."
    if "Check failed" in text:
        return f"Likely cause: Ray aborted (see the 'Check failed' line); the machine {busy}."
    if load > 2 * cores:
        return f"Likely cause: a busy machine {busy}."
    return f"Machine state: {busy}."


def free_ports(n: int, ip: str = "127.0.0.1") -> list[int]:
    """``n`` distinct TCP ports free on ``ip`` right now."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((ip, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def loopback_prefix() -> str:
    """A ``127.K.`` prefix no listening socket on this machine uses: the emulated hosts of one
    cluster get their own loopback addresses ``127.K.x.y`` (Linux routes all of 127/8 to lo)."""
    used = set()
    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections(kind="inet4"):
            if conn.laddr and conn.laddr.ip.startswith("127."):
                used.add(int(conn.laddr.ip.split(".")[1]))
    free = [k for k in range(2, 255) if k not in used]
    return f"127.{random.choice(free)}."


def host_ip(prefix: str, index: int) -> str:
    """The address of the ``index``-th host (0-based) under ``prefix`` (``"127.K."``)."""
    return f"{prefix}{index // 250}.{index % 250 + 1}"


def _pid_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is left in process group ``pgid``."""
    if pgid <= 0:
        return False
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                return True
        except (psutil.Error, OSError):
            continue
    return False


def signal_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to every process of group ``pgid`` (nothing if the group is gone)."""
    if pgid <= 0:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def wait_groups_gone(pgids: list[int], timeout_s: float) -> None:
    """Wait up to ``timeout_s`` seconds until no process is left in any of ``pgids``."""
    deadline = time.monotonic() + timeout_s
    left = [p for p in pgids if p > 0]
    while left and time.monotonic() < deadline:
        alive = set()
        for proc in psutil.process_iter(["status"]):
            try:
                if proc.info["status"] != psutil.STATUS_ZOMBIE:
                    alive.add(os.getpgid(proc.pid))
            except (psutil.Error, OSError):
                continue
        left = [p for p in left if p in alive]
        if left:
            time.sleep(0.1)


def in_cluster(pid: int, folder: str) -> bool:
    """Whether process ``pid`` runs with ``FOLDER_ENV=folder`` (read from ``/proc``: psutil
    returns an empty environment for processes that renamed themselves, as Ray's agents and
    workers do)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{FOLDER_ENV}={folder}".encode() in raw.split(b"\0")


def kill_strays(folder: str) -> None:
    """SIGKILL every process whose command line names ``folder`` or that runs in that emulated
    cluster (``FOLDER_ENV``): Ray daemons that left their node's process group."""
    me = os.getpid()
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if proc.pid == me:
                continue
            if any(part == folder or f"{folder}/" in part for part in proc.info["cmdline"] or []) \
                    or in_cluster(proc.pid, folder):
                proc.kill()
        except psutil.Error:
            pass
