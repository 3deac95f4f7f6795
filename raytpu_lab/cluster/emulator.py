"""A local emulated TPU cluster: a real Ray head and one real Ray node per TPU host.

Each host node is started with ``ray start`` (daemonised, tracked by process group, see
:mod:`raytpu_lab.cluster._nodes`), its own loopback address, and the environment a GKE TPU pod gets
(:func:`raytpu_lab.cluster.gke_env.tpu_host_environment`) plus ``--resources={"TPU": chips}``, as
KubeRay does. Ray then derives the TPU labels and the ``TPU-<pod type>-head`` resource itself, so
``ray.util.tpu.slice_placement_group`` and ``JaxTrainer(use_tpu=True)`` run unmodified. JAX on an
emulated host runs on CPU with one XLA device per chip.

Isolation: every cluster has its own Ray temp dir (``<state root>/<name>/ray``) and explicit
addresses; nothing reads Ray's "current cluster" file, so a test cluster and the demo cluster on one
machine never cross. A small JSON file in the same folder records the address and process ids so
that another process can find or stop the cluster (:mod:`raytpu_lab.cluster.emulator_state`; its
public names are importable from here too). This module starts one: :func:`up`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from raytpu_lab import _ray_private
from raytpu_lab.advice import cmd, opt
from raytpu_lab.cluster import _addresses, _node_environment, _nodes, _priority, _process_groups
from raytpu_lab.cluster._node_environment import AUTH_ENV
from raytpu_lab.cluster.emulator_state import (
    DEFAULT_NAME,
    EmulatedCluster,
    EmulatedHost,
    down_in_background,
    find,
    running,
    state_root,
)
from raytpu_lab.cluster.gke_env import (
    EMULATED_LABEL,
    container_environment,
    emulated_jax_environment,
    emulated_slice_environment,
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
    "DEFAULT_NAME", "AUTH_ENV", "down_in_background",
]

_HEAD_NUM_CPUS = 2
_HOST_NUM_CPUS = 4
HOST_MEMORY_BYTES = 100 * 1024 * 1024
"""Memory one emulated host costs, rounded up: PSS of its raylet ~10 MB, two agent shims ~9 MB and
its two agents forked from the cluster's agent fork server ~65 MB (``benchmarks/emulator.py``,
Ray 2.60, a driver connected); the head costs about 760 MB."""
_HEAD_MEMORY_BYTES = 800 * 1024 * 1024
HOSTS_PER_CORE = 40
"""Emulated hosts per CPU core ``up`` accepts: their idle daemons poll, and at 64 hosts on 2 cores
(a v6e 16x16) a machine stays usable (see ``benchmarks/emulator.py``)."""


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


def up(
    specs: Sequence[tuple[str, int]] = (("v6e:4x4", 2),),
    *,
    name: str = DEFAULT_NAME,
    timeout_s: float = 180.0,
    groups: Sequence[HostGroup] | None = None,
    namespace: str = "default",
    progress: Callable[[int, int], None] | None = None,
) -> EmulatedCluster:
    """Start an emulated TPU cluster: a CPU-only head plus one Ray node per TPU host.

    Each host gets its own loopback address (``127.K.x.y``), as TPU VMs have their own IPs, and
    every port of every node is chosen free, so several emulated clusters coexist.

    Args:
        specs: ``[(spec, slices)]``; spec is ``"<version>:<topology>"`` as in :func:`parse_spec`,
            e.g. ``[("v6e:4x4", 2)]`` gives 2 slices x 4 hosts x 4 chips.
        name: Cluster name; also names its folder under :func:`state_root`.
        timeout_s: Seconds to wait for every node to start (failed starts are retried within it).
        groups: Worker groups with their names, manifest env and ``ray start`` resources (from a
            RayCluster manifest, see :mod:`raytpu_lab.kuberay.emulate`); replaces
            ``specs`` when given.
        namespace: The namespace the hosts' environment names (``RAY_CLUSTER_NAMESPACE``).
        progress: Called as ``progress(hosts up, hosts expected)`` while hosts start.

    Returns:
        The running cluster. Every node has registered with the GCS.

    Raises:
        InvalidTopologyError: A spec is not valid for its generation (before anything starts).
        EmulatorError: A cluster with this name already runs, the machine cannot hold that many
            hosts (before anything starts), or a node failed to start, died, or the timeout
            passed (its log tail and the likely cause are in the message; everything already
            started is stopped and the logs are kept).
    """
    deadline = time.monotonic() + timeout_s
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
                fix=("Ask for at least 1 slice, e.g. ", opt("slices", 1), "."),
            )
    _check_machine_size(sum(shape.num_hosts * count for shape, count in shapes))
    running = find(name)
    if running is not None:
        raise EmulatorError(
            f"An emulated cluster named {name!r} is already running at {running.address}.",
            why="Only one emulated cluster per name runs at a time.",
            fix=("Connect to it (", cmd("connect", running.address), ") or stop it first (",
                 cmd("down", name=name), ")."),
        )
    folder = state_root() / name
    _check_socket_room(folder)
    shutil.rmtree(folder, ignore_errors=True)
    # Ray 2.60 turns token authentication on for a head when ~/.ray/auth_token exists, but not
    # for worker nodes or drivers given an explicit address; say it everywhere (see AUTH_ENV).
    _ray_private.ensure_auth_token()
    (folder / "logs").mkdir(parents=True)
    prefix = _addresses.loopback_prefix()
    head_ports: dict[str, int] = {}

    def head_port_flags() -> list[str]:
        gcs, dash, client = _addresses.free_ports(3)
        head_ports.update(gcs=gcs, dashboard=dash, client=client)
        return [f"--port={gcs}", f"--dashboard-port={dash}", f"--ray-client-server-port={client}"]

    head = _nodes.NodeSpec("head", {}, [], "127.0.0.1")
    hosts: list[EmulatedHost] = []
    nodes: list[_nodes.NodeSpec] = []
    run = _nodes.launcher(folder)
    # Started first: it imports the agents' modules while the head starts.
    agents_pgid = _node_environment.start_agent_forkserver(folder)
    try:
        head.args = ["--head", f"--num-cpus={_HEAD_NUM_CPUS}", "--include-dashboard=true",
                     "--dashboard-host=127.0.0.1", f"--temp-dir={folder / 'ray'}"]

        def head_flags() -> list[str]:
            # Fresh ports per attempt; the head's environment names its GCS port (KubeRay's
            # RAY_ADDRESS / RAY_PORT, which Ray code on the head reads).
            flags = head_port_flags()
            head.env = {**os.environ, **head_environment(
                cluster=name, gcs_port=head_ports["gcs"], namespace=namespace)}
            return flags

        _nodes.start_head(run, folder, head, deadline, head_flags)
        gcs_port = head_ports["gcs"]
        address = f"127.0.0.1:{gcs_port}"
        # Hosts' agents are forked from the server once it listens (else started as Ray does).
        forked_agents = _node_environment.agent_forkserver_ready(
            folder, agents_pgid, min(60.0, max(0.0, deadline - time.monotonic())))
        for group in host_groups:
            shape = group.shape
            first = _replica_indices(shapes, shape, group.replicas) if groups is None else \
                range(group.replicas)
            for replica in first:
                slice_ips = [_addresses.host_ip(prefix, len(nodes) + w) for w in range(shape.num_hosts)]
                coordinator_port = _addresses.free_ports(1, "0.0.0.0")[0]  # free on every address
                for worker_id in range(shape.num_hosts):
                    env = os.environ.copy()
                    env.update(_manifest_env(group, cluster=name, namespace=namespace,
                                             replica=replica, worker_id=worker_id,
                                             ip=slice_ips[worker_id]))
                    env.update(tpu_host_environment(
                        shape, cluster=name, replica=replica, worker_id=worker_id,
                        head_host="127.0.0.1", gcs_port=gcs_port, namespace=namespace,
                        group=group.name))
                    env.update(emulated_jax_environment(shape))
                    env.update(emulated_torch_xla_environment())
                    env.update(_node_environment.AGENT_PIPE_ENV)
                    if forked_agents:
                        env[_node_environment.FORKSERVER_ENV] = str(_node_environment.forkserver_socket(folder))
                    env.update(emulated_slice_environment(
                        shape, coordinator=f"{slice_ips[0]}:{coordinator_port}",
                        host_ips=slice_ips))
                    # The start-up hook that lets JAX see the whole slice (jax_slice.py).
                    env["PYTHONPATH"] = os.pathsep.join(
                        p for p in (_SITE_DIR, env.get("PYTHONPATH", "")) if p)
                    label = f"{slice_name(group.name, replica)}-w{worker_id}"
                    # Our own node label marks an emulated TPU host (e.g. torch runs pick the
                    # gloo process group there); GKE never sets it.
                    labels = {**group.labels, EMULATED_LABEL: "true"}
                    args = [
                        f"--address={address}",
                        f"--num-cpus={group.num_cpus or _HOST_NUM_CPUS}",
                        *([f"--memory={group.memory_bytes}"] if group.memory_bytes else []),
                        f"--resources={json.dumps({**group.resources, 'TPU': shape.chips_per_host})}",
                        f"--labels={json.dumps(labels)}",
                        # One log monitor per machine (the head's), as ray/cluster_utils.py does.
                        "--include-log-monitor=False",
                    ]
                    # KubeRay stores the `ray start` command it generated; ours, less ports.
                    env["KUBERAY_GEN_RAY_START_CMD"] = " ".join(["ray", "start", *args, "--block"])
                    # Its own temp dir: Ray names a node's sockets by probing for free file
                    # names, which races when nodes sharing a session dir start together.
                    args.append(f"--temp-dir={folder / f'h{len(nodes)}'}")
                    nodes.append(_nodes.NodeSpec(label, env, args, slice_ips[worker_id]))
                    hosts.append(EmulatedHost(
                        slice_name=slice_name(group.name, replica), worker_id=worker_id,
                        spec=f"{shape.version}:{shape.topology}", pid=0, group=group.name,
                        ip=slice_ips[worker_id]))
        _nodes.start_hosts(run, folder, head, nodes, deadline, progress)
        _priority.normal_priority(head)
        hosts = [dataclasses.replace(h, pid=n.pgid) for h, n in zip(hosts, nodes, strict=True)]
        run.close()
    except BaseException as err:
        pgids = [n.pgid for n in nodes] + [head.pgid, agents_pgid]
        for pgid in pgids:
            _process_groups.signal_group(pgid, signal.SIGKILL)
        run.close()
        _process_groups.kill_strays(str(folder))
        kept = _keep_raylet_logs(folder)
        shutil.rmtree(folder, ignore_errors=True)
        if isinstance(err, EmulatorError) and kept:
            err.fix += f" Node and raylet logs are kept in {kept}."
            err.args = (err._compose(),)
        raise
    cluster = EmulatedCluster(
        name=name, address=address,
        dashboard_url=f"http://127.0.0.1:{head_ports['dashboard']}",
        specs=[(f"{s.version}:{s.topology}", c) for s, c in shapes], head_pid=head.pgid,
        hosts=hosts, namespace=namespace, client_port=head_ports["client"],
        agents_pid=agents_pgid)
    (folder / "cluster.json").write_text(cluster.to_json())
    return cluster


def _manifest_env(group: HostGroup, *, cluster: str, namespace: str, replica: int,
                  worker_id: int, ip: str) -> dict[str, str]:
    if not group.env:
        return {}
    labels = worker_pod_labels(group.shape, cluster=cluster, group=group.name, replica=replica,
                               worker_id=worker_id)
    env, _skipped = container_environment(
        group.env, pod=pod_name(cluster, group.name, replica, worker_id), namespace=namespace,
        labels=labels, node_ip=ip, pod_ip=ip)
    return env


def _check_machine_size(hosts: int) -> None:
    cores = os.cpu_count() or 1
    need = hosts * HOST_MEMORY_BYTES + _HEAD_MEMORY_BYTES
    available = psutil.virtual_memory().available
    if hosts > HOSTS_PER_CORE * cores or need > 0.8 * available:
        raise EmulatorError(
            f"{hosts} emulated TPU hosts are too many for this machine ({cores} cores, "
            f"{available / 2**30:.1f} GiB free; they need about {need / 2**30:.1f} GiB).",
            why=f"Each host is a real Ray node (~{HOST_MEMORY_BYTES // 2**20} MB, plus the head); "
                f"at most {HOSTS_PER_CORE} per core, and 80% of free memory, are used.",
            fix=("Emulate fewer or smaller slices (e.g. ", opt("tpu", "v6e:4x4"), " ",
                 opt("slices", 2), "); use a real cluster (", cmd("connect", "ADDRESS"),
                 ") for pod-scale topologies."))


# Ray puts Unix sockets under <node temp dir>/session_<date>_<time>_<usec>_<pid>/sockets/ and
# refuses paths over 107 bytes (AF_UNIX). The longest ones (Ray 2.60): a host's plasma store
# (temp dir <folder>/h<index>) and the head's dashboard modules, dash_<Module>, of which
# dash_MetricsHead is the longest (temp dir <folder>/ray). The pid part can have 7 digits.
_SOCKET_PATH_MAX = 107
_SESSION = len("/session_2026-11-30_12-39-30_311840_4194304")
_UNDER_FOLDER = _SESSION + max(len("/h999/sockets/plasma_store"),
                               len("/ray/sockets/dash_MetricsHead"))


def max_name_length() -> int:
    """The longest cluster name whose folder under :func:`state_root` leaves room for Ray's Unix
    socket paths (at most 107 bytes on Linux)."""
    return _SOCKET_PATH_MAX - _UNDER_FOLDER - len(str(state_root() / "x")) + 1


def _check_socket_room(folder: Path) -> None:
    if len(str(folder)) + _UNDER_FOLDER > _SOCKET_PATH_MAX:
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


_SITE_DIR = str(Path(__file__).with_name("_site"))


def _replica_indices(shapes: list[tuple[SliceShape, int]], shape: SliceShape, count: int) -> range:
    # Two specs of the same shape share one worker group, so their replica indices continue.
    before = 0
    for other, other_count in shapes:
        if other is shape:
            break
        if group_name(other) == group_name(shape):
            before += other_count
    return range(before, before + count)


