"""Emulated clusters on this machine: the record of a running one and finding, listing, stopping them.

Every cluster lives in its own folder under :func:`state_root`; a small JSON file there
(``cluster.json``) records its address and process ids, so that another process can find or stop
it. Starting one is :func:`raytpu_lab.cluster.emulator.up`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from raytpu_lab.cluster import _process_groups
from raytpu_lab.errors import EmulatorError
from raytpu_lab.tpu.topology import SliceShape, parse_spec

__all__ = ["DEFAULT_NAME", "state_root", "EmulatedHost", "EmulatedCluster", "find",
           "down_in_background", "running"]

DEFAULT_NAME = "raytpu"


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
        pid: Process-group id of its Ray daemons (raylet and agents).
        group: Its worker group's name (``RAY_NODE_TYPE_NAME``).
        ip: Its own address (``--node-ip-address``), a loopback address ``127.K.x.y``.
    """

    slice_name: str
    worker_id: int
    spec: str
    pid: int
    group: str = ""
    ip: str = "127.0.0.1"



@dataclass
class EmulatedCluster:
    """A running emulated cluster. Create it with :func:`up`; find a running one with :func:`find`.

    Attributes:
        name: Cluster name (``RAY_CLUSTER_NAME`` on every host).
        address: GCS address of the head, ``"127.0.0.1:<port>"``; pass it to ``ray.init``.
        dashboard_url: The Ray dashboard, ``"http://127.0.0.1:<port>"``.
        specs: ``[(spec, slices)]`` it was started with, e.g. ``[("v6e:4x4", 2)]``.
        head_pid: Process-group id of the head's Ray daemons (GCS, dashboard, raylet, agents).
        hosts: One entry per TPU host.
        namespace: The Kubernetes namespace its hosts' environment names (``RAY_CLUSTER_NAMESPACE``).
        client_port: The head's Ray Client server port (``ray://127.0.0.1:<port>``), or 0.
        agents_pid: Process-group id of the hosts' agent fork server and the agents it forked
            (``_agent_forkserver.py``), or 0.
    """

    name: str
    address: str
    dashboard_url: str
    specs: list[tuple[str, int]]
    head_pid: int
    hosts: list[EmulatedHost] = field(default_factory=list)
    namespace: str = "default"
    client_port: int = 0
    agents_pid: int = 0

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

    def holds(self, specs: Sequence[tuple[str, int]]) -> bool:
        """Whether it was started with at least these slices: ``[(spec, slices)]``, e.g.
        ``[("v6e:4x4", 2)]``; specs are compared by shape, so ``"v5e:2x2"`` matches
        ``"v5litepod:2x2"``.

        Raises:
            InvalidTopologyError: A spec is not valid for its generation.
        """
        def count(pairs: Sequence[tuple[str, int]]) -> Counter[SliceShape]:
            counts: Counter[SliceShape] = Counter()
            for spec, n in pairs:
                counts[parse_spec(spec)] += int(n)
            return counts

        have, want = count(self.specs), count(specs)
        return all(have[shape] >= n for shape, n in want.items())

    def stop_host(self, slice_name: str, worker_id: int) -> EmulatedHost:
        """Kill one TPU host (SIGKILL to its process group: raylet, agents and its workers), as
        a TPU VM that dies would; Ray then marks its node dead and the slice turns degraded.
        It is not restarted (start the cluster again for a whole slice).

        Returns:
            The host stopped.

        Raises:
            EmulatorError: The cluster has no host ``worker_id`` on slice ``slice_name`` (the
                message lists the slices).
        """
        host = next((h for h in self.hosts if h.slice_name == slice_name and h.worker_id == worker_id),
                    None)
        if host is None:
            slices = ", ".join(f"{s} (workers 0-{n - 1})" for s, n in self.expected_hosts.items())
            raise EmulatorError(f"Emulated cluster {self.name!r} has no host {worker_id} on "
                                f"slice {slice_name!r}.", why=f"Its slices: {slices}.",
                                fix="Pass a slice name and worker id from that list.")
        _process_groups.signal_group(host.pid, signal.SIGKILL)
        return host

    def is_running(self) -> bool:
        """Whether the head's processes are still alive."""
        return _process_groups.group_alive(self.head_pid)

    def down(self, timeout_s: float = 5.0) -> None:
        """Stop every process of this cluster and remove its folder.

        SIGTERM to every node's process group, SIGKILL to whatever is left after ``timeout_s``
        seconds, then a sweep for any process of this cluster that left its group (Ray workers,
        job drivers). Idempotent.
        """
        pgids = [h.pid for h in self.hosts] + [self.head_pid, self.agents_pid]
        for pgid in pgids:
            _process_groups.signal_group(pgid, signal.SIGTERM)
        _process_groups.wait_groups_gone(pgids, timeout_s)
        for pgid in pgids:
            _process_groups.signal_group(pgid, signal.SIGKILL)
        _process_groups.kill_strays(str(self.folder))
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



def down_in_background(cluster: EmulatedCluster) -> None:
    """Stop ``cluster`` from a new process of its own session (:meth:`EmulatedCluster.down`), so
    the stop completes even if the caller is killed a moment later (a kernel at exit)."""
    code = ("import sys; from raytpu_lab.cluster import emulator\n"
            "c = emulator.find(sys.argv[1])\n"
            "c is not None and c.head_pid == int(sys.argv[2]) and c.down()\n")
    subprocess.Popen([sys.executable, "-c", code, cluster.name, str(cluster.head_pid)],
                     env={**os.environ, "RAYTPU_EMULATOR_ROOT": str(state_root())}, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)



def running() -> list[EmulatedCluster]:
    """Every emulated cluster running on this machine (under :func:`state_root`)."""
    root = state_root()
    if not root.exists():
        return []
    found = (find(p.name) for p in sorted(root.iterdir()) if p.is_dir())
    return [c for c in found if c is not None]
