"""A local emulated TPU cluster: a real Ray head and one real Ray node per TPU host.

Each host node is started with ``ray start`` and the environment a GKE TPU pod gets
(:func:`raytpu_lab.cluster.gke_env.tpu_host_environment`) plus ``--resources={"TPU": chips}``, as
KubeRay does. Ray then derives the TPU labels and the ``TPU-<pod type>-head`` resource itself, so
``ray.util.tpu.slice_placement_group`` and ``JaxTrainer(use_tpu=True)`` run unmodified. JAX on an
emulated host runs on CPU with one XLA device per chip.

Isolation: every cluster has its own Ray temp dir (``<state root>/<name>/ray``) and explicit
addresses; nothing reads Ray's "current cluster" file, so a test cluster and the demo cluster on one
machine never cross. A small JSON file in the same folder records the address and process ids so
that another process can find or stop the cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from raytpu_lab import _ray_private
from raytpu_lab.cluster.gke_env import (
    EMULATED_LABEL,
    container_environment,
    emulated_jax_environment,
    emulated_torch_xla_environment,
    group_name,
    head_environment,
    pod_name,
    slice_name,
    tpu_host_environment,
    worker_pod_labels,
)
from raytpu_lab.errors import EmulatorError
from raytpu_lab.tpu.topology import SliceShape, parse_spec

__all__ = [
    "EmulatedCluster", "EmulatedHost", "HostGroup", "up", "find", "running", "state_root",
    "DEFAULT_NAME", "AUTH_ENV",
]

DEFAULT_NAME = "raytpu"
_HEAD_NUM_CPUS = 2
_HOST_NUM_CPUS = 4
_OBJECT_STORE_BYTES = 128 * 1024 * 1024  # per node; Ray's minimum is 75 MiB
_STARTED_MARK = "Ray runtime started"
_MAX_STARTING = 4
_START_ATTEMPTS = 5
_REGISTRATION_TIMEOUT_MARK = "timed out during startup"
HOST_MEMORY_BYTES = 280 * 1024 * 1024
"""Memory one emulated host costs (raylet, dashboard agent, runtime-env agent), measured."""
HOSTS_PER_CORE = 12
"""More emulated hosts than this per CPU core miss Ray's fixed 30 s node-registration window."""
AUTH_ENV = {"RAY_AUTH_MODE": "token"}
"""Environment every emulated node runs with, and a driver needs to connect: Ray token auth with
the token in Ray's default file ``~/.ray/auth_token`` (Ray listens on every interface, so a local
cluster without a token would take code from anyone on the network)."""


def state_root() -> Path:
    """Folder holding one sub-folder per emulated cluster (``$RAYTPU_EMULATOR_ROOT`` or ``/tmp/raytpu``).

    Kept short on purpose: Ray puts Unix sockets under it and socket paths are limited to 107 bytes.
    """
    return Path(os.environ.get("RAYTPU_EMULATOR_ROOT", Path(tempfile.gettempdir()) / "raytpu"))


@dataclass(frozen=True)
class EmulatedHost:
    """One emulated TPU host (one Ray node).

    Attributes:
        slice_name: ``TPU_NAME`` of its slice, e.g. ``"tpu-v6e-4x4-0"``.
        worker_id: ``TPU_WORKER_ID`` within the slice.
        spec: ``"<version>:<topology>"`` of its slice.
        pid: Process id of its ``ray start --block`` process.
        group: Its worker group's name (``RAY_NODE_TYPE_NAME``).
    """

    slice_name: str
    worker_id: int
    spec: str
    pid: int
    group: str = ""


@dataclass(frozen=True)
class HostGroup:
    """One TPU worker group to emulate, as a RayCluster manifest describes it.

    Attributes:
        name: ``groupName`` (``RAY_NODE_TYPE_NAME``; slices are ``<name>-<replica>``).
        shape: Generation, topology and chips per host.
        replicas: Slices.
        env: The Ray container's ``env`` list as written in the manifest; resolved per host
            (:func:`raytpu_lab.cluster.gke_env.container_environment`) under what GKE/KubeRay
            inject, which wins for the same variable, as do the emulator's JAX-on-CPU variables.
        num_cpus: ``ray start --num-cpus`` (KubeRay: the CPU limit); the emulator's default if ``None``.
        memory_bytes: ``ray start --memory`` (KubeRay: the memory limit), or ``None``.
        resources: Extra custom resources for ``--resources`` (the group's ``resources`` map).
        labels: Extra node labels for ``--labels`` (the group's ``labels`` map).
    """

    name: str
    shape: SliceShape
    replicas: int
    env: tuple[Mapping[str, object], ...] = ()
    num_cpus: int | None = None
    memory_bytes: int | None = None
    resources: Mapping[str, float] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass
class EmulatedCluster:
    """A running emulated cluster. Create it with :func:`up`; find a running one with :func:`find`.

    Attributes:
        name: Cluster name (``RAY_CLUSTER_NAME`` on every host).
        address: GCS address of the head, ``"127.0.0.1:<port>"``; pass it to ``ray.init``.
        dashboard_url: The Ray dashboard, ``"http://127.0.0.1:<port>"``.
        specs: ``[(spec, slices)]`` it was started with, e.g. ``[("v6e:4x4", 2)]``.
        head_pid: Process id of the head's ``ray start --block``.
        hosts: One entry per TPU host.
        namespace: The Kubernetes namespace its hosts' environment names (``RAY_CLUSTER_NAMESPACE``).
        client_port: The head's Ray Client server port (``ray://127.0.0.1:<port>``), or 0.
    """

    name: str
    address: str
    dashboard_url: str
    specs: list[tuple[str, int]]
    head_pid: int
    hosts: list[EmulatedHost] = field(default_factory=list)
    namespace: str = "default"
    client_port: int = 0

    @property
    def folder(self) -> Path:
        """This cluster's folder: state file, Ray temp dir and node logs."""
        return state_root() / self.name

    @property
    def expected_hosts(self) -> dict[str, int]:
        """``{slice name: number of hosts}`` the cluster was started with."""
        counts: dict[str, int] = {}
        for host in self.hosts:
            counts[host.slice_name] = counts.get(host.slice_name, 0) + 1
        return counts

    def is_running(self) -> bool:
        """Whether the head process is still alive."""
        return _alive(self.head_pid)

    def down(self, timeout_s: float = 5.0) -> None:
        """Stop every process of this cluster and remove its folder.

        Hosts first, then the head; SIGTERM to each node's process group, SIGKILL to whatever is left
        after ``timeout_s`` seconds, then a sweep for any process whose command line names this
        cluster's temp dir (Ray daemons that left the group). Idempotent.
        """
        pids = [h.pid for h in self.hosts] + [self.head_pid]
        for pid in pids:
            _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for pid in pids:
            _wait_gone(pid, max(0.1, deadline - time.monotonic()))
        for pid in pids:
            _signal_group(pid, signal.SIGKILL)
        _kill_strays(str(self.folder))
        shutil.rmtree(self.folder, ignore_errors=True)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> EmulatedCluster:
        data = json.loads(text)
        data["hosts"] = [EmulatedHost(**h) for h in data["hosts"]]
        data.setdefault("namespace", "default")
        data["specs"] = [tuple(s) for s in data["specs"]]
        return cls(**data)


def find(name: str = DEFAULT_NAME) -> EmulatedCluster | None:
    """The running emulated cluster called ``name``, or ``None``.

    A state file whose head process is gone is stale: its leftovers are cleaned and ``None`` returned.
    """
    state_file = state_root() / name / "cluster.json"
    try:
        cluster = EmulatedCluster.from_json(state_file.read_text())
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if cluster.is_running():
        return cluster
    cluster.down(timeout_s=2.0)
    return None


def running() -> list[EmulatedCluster]:
    """Every emulated cluster running on this machine (under :func:`state_root`)."""
    root = state_root()
    if not root.exists():
        return []
    found = (find(p.name) for p in sorted(root.iterdir()) if p.is_dir())
    return [c for c in found if c is not None]


def up(
    specs: Sequence[tuple[str, int]] = (("v6e:4x4", 2),),
    *,
    name: str = DEFAULT_NAME,
    timeout_s: float = 180.0,
    groups: Sequence[HostGroup] | None = None,
    namespace: str = "default",
) -> EmulatedCluster:
    """Start an emulated TPU cluster: a CPU-only head plus one Ray node per TPU host.

    Args:
        specs: ``[(spec, slices)]``; spec is ``"<version>:<topology>"`` as in :func:`parse_spec`,
            e.g. ``[("v6e:4x4", 2)]`` gives 2 slices x 4 hosts x 4 chips.
        name: Cluster name; also names its folder under :func:`state_root`.
        timeout_s: Seconds to wait for every node to start.
        groups: Worker groups with their names, manifest env and ``ray start`` resources (from a
            RayCluster manifest, see :mod:`raytpu_lab.cluster.kuberay_emulator`); replaces
            ``specs`` when given.
        namespace: The namespace the hosts' environment names (``RAY_CLUSTER_NAMESPACE``).

    Returns:
        The running cluster. Nodes may still be registering with the GCS for a moment; connect with
        :func:`raytpu_lab.cluster.connect.connect`, which waits for the expected hosts.

    Raises:
        InvalidTopologyError: A spec is not valid for its generation (before anything starts).
        EmulatorError: A cluster with this name already runs, or a node failed to start (its log
            tail is in the message; everything already started is stopped).
    """
    if groups is None:
        shapes = [(parse_spec(spec), int(count)) for spec, count in specs]
        host_groups = [HostGroup(group_name(shape), shape, count) for shape, count in shapes]
    else:
        host_groups = list(groups)
        shapes = [(g.shape, int(g.replicas)) for g in host_groups]
    for shape, count in shapes:
        if count < 1:
            raise EmulatorError(
                f"Asked for {count} slices of {shape.pod_type}.",
                fix="Ask for at least 1 slice, e.g. --slices 1.",
            )
    _check_machine_size(sum(shape.num_hosts * count for shape, count in shapes))
    running = find(name)
    if running is not None:
        raise EmulatorError(
            f"An emulated cluster named {name!r} is already running at {running.address}.",
            why="Only one emulated cluster per name runs at a time.",
            fix=f"Connect to it (%raytpu connect {running.address}) or stop it first "
                f"(%raytpu down --name {name}, or raytpu down --name {name} in a shell).",
        )
    folder = state_root() / name
    _check_socket_room(folder)
    shutil.rmtree(folder, ignore_errors=True)
    # Ray 2.60 turns token authentication on for a head when ~/.ray/auth_token exists, but not
    # for worker nodes or drivers given an explicit address; say it everywhere (see AUTH_ENV).
    _ray_private.ensure_auth_token()
    (folder / "logs").mkdir(parents=True)
    gcs_port, dashboard_port, client_port = _free_ports(3)
    address = f"127.0.0.1:{gcs_port}"
    started: list[subprocess.Popen[bytes]] = []
    try:
        head = _start_node(
            folder, "head", {**os.environ, **head_environment(cluster=name, gcs_port=gcs_port,
                                                               namespace=namespace)},
            ["--head", "--node-ip-address=127.0.0.1", f"--port={gcs_port}",
             f"--num-cpus={_HEAD_NUM_CPUS}",
             "--include-dashboard=true", "--dashboard-host=127.0.0.1",
             f"--dashboard-port={dashboard_port}", f"--ray-client-server-port={client_port}",
             f"--temp-dir={folder / 'ray'}"],
        )
        started.append(head)
        _wait_started([(head, folder / "logs" / "head.log")], timeout_s)

        hosts: list[EmulatedHost] = []
        to_start: list[tuple[str, dict[str, str], list[str]]] = []
        for group in host_groups:
            shape = group.shape
            first = _replica_indices(shapes, shape, group.replicas) if groups is None else \
                range(group.replicas)
            for replica in first:
                for worker_id in range(shape.num_hosts):
                    env = os.environ.copy()
                    env.update(_manifest_env(group, cluster=name, namespace=namespace,
                                             replica=replica, worker_id=worker_id))
                    env.update(tpu_host_environment(
                        shape, cluster=name, replica=replica, worker_id=worker_id,
                        head_host="127.0.0.1", gcs_port=gcs_port, namespace=namespace,
                        group=group.name))
                    env.update(emulated_jax_environment(shape))
                    env.update(emulated_torch_xla_environment())
                    label = f"{slice_name(group.name, replica)}-w{worker_id}"
                    # Our own node label marks an emulated TPU host (e.g. torch runs pick the
                    # gloo process group there); GKE never sets it.
                    labels = {**group.labels, EMULATED_LABEL: "true"}
                    to_start.append((label, env, [
                        f"--address={address}", "--node-ip-address=127.0.0.1",
                        f"--num-cpus={group.num_cpus or _HOST_NUM_CPUS}",
                        *([f"--memory={group.memory_bytes}"] if group.memory_bytes else []),
                        f"--resources={json.dumps({**group.resources, 'TPU': shape.chips_per_host})}",
                        f"--labels={json.dumps(labels)}",
                        # Its own temp dir: Ray names a node's sockets by probing for free file
                        # names, which races when nodes sharing a session dir start together.
                        f"--temp-dir={folder / f'h{len(to_start)}'}",
                    ]))
                    hosts.append(EmulatedHost(
                        slice_name=slice_name(group.name, replica), worker_id=worker_id,
                        spec=f"{shape.version}:{shape.topology}", pid=0, group=group.name))
        for _label, env, args in to_start:
            # KubeRay stores the `ray start` command it generated; ours, less per-node ports.
            env["KUBERAY_GEN_RAY_START_CMD"] = " ".join(["ray", "start", *args[:-1], "--block"])
        pids = _start_in_waves(folder, to_start, started, timeout_s)
        hosts = [EmulatedHost(h.slice_name, h.worker_id, h.spec, pid, h.group)
                 for h, pid in zip(hosts, pids, strict=True)]
    except BaseException as err:
        for proc in reversed(started):
            _signal_group(proc.pid, signal.SIGKILL)
        _kill_strays(str(folder))
        kept = _keep_raylet_logs(folder)
        shutil.rmtree(folder, ignore_errors=True)
        if isinstance(err, EmulatorError) and kept:
            err.fix += f" Node and raylet logs are kept in {kept}."
            err.args = (err._compose(),)
        raise
    cluster = EmulatedCluster(
        name=name, address=address, dashboard_url=f"http://127.0.0.1:{dashboard_port}",
        specs=[(f"{s.version}:{s.topology}", c) for s, c in shapes], head_pid=head.pid, hosts=hosts,
        namespace=namespace, client_port=client_port)
    (folder / "cluster.json").write_text(cluster.to_json())
    return cluster


def _manifest_env(group: HostGroup, *, cluster: str, namespace: str, replica: int,
                  worker_id: int) -> dict[str, str]:
    if not group.env:
        return {}
    labels = worker_pod_labels(group.shape, cluster=cluster, group=group.name, replica=replica,
                               worker_id=worker_id)
    env, _skipped = container_environment(
        group.env, pod=pod_name(cluster, group.name, replica, worker_id), namespace=namespace,
        labels=labels)
    return env


def _start_in_waves(folder: Path, nodes: list[tuple[str, dict[str, str], list[str]]],
                    started: list[subprocess.Popen[bytes]], timeout_s: float) -> list[int]:
    """Start nodes with at most ``_MAX_STARTING`` registering at once; return their pids in order.

    ``ray start`` gives a node a fixed 30 s to register with the GCS; on 2 cores, a dozen raylets
    and their agents starting together (or a busy machine) can miss it. Such a node is killed and
    started again with fresh ports, up to ``_START_ATTEMPTS`` times, and fewer nodes start at
    once from then on (the machine is busier than the waves assumed).
    """
    deadline = time.monotonic() + timeout_s
    procs: dict[int, subprocess.Popen[bytes]] = {}
    attempts = [0] * len(nodes)
    pending = list(range(len(nodes)))
    in_flight: list[int] = []
    max_starting = _MAX_STARTING
    while pending or in_flight:
        while pending and len(in_flight) < max_starting:
            i = pending.pop(0)
            label, env, args = nodes[i]
            attempts[i] += 1
            procs[i] = _start_node(folder, label, env, [*args, *_host_port_flags()])
            started.append(procs[i])
            in_flight.append(i)
        time.sleep(0.2)
        still = []
        for i in in_flight:
            log = folder / "logs" / f"{nodes[i][0]}.log"
            text = log.read_text(errors="replace") if log.exists() else ""
            if _STARTED_MARK in text:
                continue
            if procs[i].poll() is None:
                still.append(i)
            elif _REGISTRATION_TIMEOUT_MARK in text and attempts[i] < _START_ATTEMPTS:
                _signal_group(procs[i].pid, signal.SIGKILL)
                pending.insert(0, i)
                max_starting = max(1, max_starting // 2)
            else:
                tail = "\n".join(text.strip().splitlines()[-15:])
                raise EmulatorError(
                    f"Emulated node {log.stem} exited with code {procs[i].returncode} while "
                    f"starting (attempt {attempts[i]}).",
                    why=f"Last lines of {log}:\n{tail}",
                    fix="Fix the cause above and run `up` again.")
        in_flight = still
        if (pending or in_flight) and time.monotonic() > deadline:
            names = ", ".join(nodes[i][0] for i in in_flight + pending)
            raise EmulatorError(
                f"{len(in_flight) + len(pending)} emulated node(s) did not start within "
                f"{timeout_s:.0f} s: {names}.",
                why="The machine may be short of CPU or memory (each host costs about 280 MB).",
                fix="Start fewer slices, or pass a longer timeout.")
    return [procs[i].pid for i in range(len(nodes))]


def _check_machine_size(hosts: int) -> None:
    cores = os.cpu_count() or 1
    need = (hosts + 1) * HOST_MEMORY_BYTES
    available = psutil.virtual_memory().available
    if hosts > HOSTS_PER_CORE * cores or need > 0.8 * available:
        raise EmulatorError(
            f"{hosts} emulated TPU hosts are too many for this machine ({cores} cores, "
            f"{available / 2**30:.1f} GiB free).",
            why=f"Each host is a real Ray node (~{HOST_MEMORY_BYTES // 2**20} MB); at most "
                f"{HOSTS_PER_CORE} per core start within Ray's node-registration timeout.",
            fix="Emulate fewer or smaller slices (e.g. --tpu v6e:4x4 --slices 2); use a real cluster "
                "(%raytpu connect) for pod-scale topologies.")


# Ray puts Unix sockets at <temp dir>/session_<date>_<time>_<usec>_<pid>/sockets/plasma_store and
# refuses paths over 107 bytes (AF_UNIX); the session part takes up to 63 of them.
_SOCKET_PATH_MAX = 107
_SESSION_AND_SOCKET = len("/session_2026-11-30_12-39-30_311840_4194304/sockets/plasma_store")


def max_name_length() -> int:
    """The longest cluster name whose folder under :func:`state_root` leaves room for Ray's Unix
    socket paths (at most 107 bytes on Linux)."""
    return _SOCKET_PATH_MAX - _SESSION_AND_SOCKET - len(str(state_root() / "x" / "h999")) + 1


def _check_socket_room(folder: Path) -> None:
    longest = str(folder / "h999")
    if len(longest) + _SESSION_AND_SOCKET > _SOCKET_PATH_MAX:
        raise EmulatorError(
            f"The emulator folder {folder} is too long for Ray's Unix sockets.",
            why=f"Ray's socket paths under it would exceed {_SOCKET_PATH_MAX} bytes.",
            fix="Set RAYTPU_EMULATOR_ROOT to a short folder (the default is /tmp/raytpu), "
                "or use a shorter cluster name.")


def _keep_raylet_logs(folder: Path) -> Path | None:
    """Copy the node logs and raylet logs of a failed start out of ``folder`` (which is removed)."""
    kept = folder.with_name(folder.name + ".failed-logs")
    shutil.rmtree(kept, ignore_errors=True)
    try:
        shutil.copytree(folder / "logs", kept)
        for raylet_log in folder.glob("*/session_latest/logs/raylet.out"):
            shutil.copy(raylet_log, kept / f"{raylet_log.parts[-4]}-raylet.out")
    except OSError:
        return None
    return kept


def _host_port_flags() -> list[str]:
    # Every port explicit: several raylets on one machine otherwise race for Ray's defaults.
    names = ["dashboard-agent-listen-port", "dashboard-agent-grpc-port", "node-manager-port",
             "object-manager-port", "metrics-export-port", "runtime-env-agent-port"]
    return [f"--{n}={p}" for n, p in zip(names, _free_ports(len(names)), strict=True)]


def _replica_indices(shapes: list[tuple[SliceShape, int]], shape: SliceShape, count: int) -> range:
    # Two specs of the same shape share one worker group, so their replica indices continue.
    before = 0
    for other, other_count in shapes:
        if other is shape:
            break
        if group_name(other) == group_name(shape):
            before += other_count
    return range(before, before + count)


_FOLDER_ENV = "RAYTPU_EMULATED_CLUSTER"
"""Set to the cluster's folder in every process of an emulated node: Ray's daemons rename
themselves (``ray::DashboardAgent``) and can outlive their process group, so the stray sweep finds
them by this variable rather than by command line."""


def _start_node(folder: Path, label: str, env: dict[str, str], args: list[str]) -> subprocess.Popen[bytes]:
    env = {**env, **AUTH_ENV, _FOLDER_ENV: str(folder)}
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # A fresh process group per node, so `down` can signal the node and all its daemons at once.
    log = open(folder / "logs" / f"{label}.log", "wb")  # noqa: SIM115 - owned by the child
    cmd = [_ray_cli(), "start", "--block", "--disable-usage-stats",
           f"--object-store-memory={_OBJECT_STORE_BYTES}", "--min-worker-port=0",
           "--max-worker-port=0", *args]
    try:
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    finally:
        log.close()


def _ray_cli() -> str:
    beside = Path(sys.executable).parent / "ray"
    found = str(beside) if beside.exists() else shutil.which("ray")
    if not found:
        raise EmulatorError("The `ray` command was not found.",
                            why=f"It is not beside {sys.executable} nor on PATH.",
                            fix="Install Ray in this environment: pip install 'ray[default,train]'.")
    return found


def _wait_started(nodes: list[tuple[subprocess.Popen[bytes], Path]], timeout_s: float) -> None:
    """Wait for each node's log to say it started; raise with the log tail if one exits first."""
    deadline = time.monotonic() + timeout_s
    for proc, log in nodes:
        while True:
            text = log.read_text(errors="replace") if log.exists() else ""
            if _STARTED_MARK in text:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(text.strip().splitlines()[-15:])
                raise EmulatorError(
                    f"Emulated node {log.stem} did not start (exit code {proc.poll()}).",
                    why=f"Last lines of {log}:\n{tail}",
                    fix="Fix the cause above and run `up` again.")
            time.sleep(0.2)


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_gone(pid: int, timeout_s: float) -> None:
    try:
        psutil.Process(pid).wait(timeout=timeout_s)
    except (psutil.Error, psutil.TimeoutExpired):
        pass


def _kill_strays(folder: str) -> None:
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(folder in part for part in proc.info["cmdline"] or []) \
                    or proc.environ().get(_FOLDER_ENV) == folder:
                proc.kill()
        except psutil.Error:
            pass
