"""What every process of an emulated node runs with: its environment (Ray token auth, Ray's
start-up waits raised, the cluster's folder) and the agent fork server its host's agents come from.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

from raytpu_lab.cluster._priority import own_autogroup_nice
from raytpu_lab.cluster._process_groups import FOLDER_ENV, group_alive

__all__ = ["AUTH_ENV", "node_environment", "FORKSERVER_ENV", "AGENT_PIPE_ENV",
           "start_agent_forkserver", "forkserver_socket", "agent_forkserver_ready"]

AUTH_ENV = {"RAY_AUTH_MODE": "token"}
"""Environment every emulated node runs with, and a driver needs to connect: Ray token auth with
the token in Ray's default file ``~/.ray/auth_token`` (Ray listens on every interface, so a local
cluster without a token would take code from anyone on the network)."""


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
    # - health_check_failure_threshold: missed GCS health checks in a row before a node is
    #   declared dead (default 5); raylets starved by such a start miss a few.
    # - health_check_period_ms: the GCS checks each node this often (default 3000). A killed
    #   host refuses the check at once, so it is found dead after ~threshold x period (2 s here,
    #   as a lost TPU VM should show on the map within 3 s); a starved but living raylet is
    #   given health_check_timeout_ms (10 s) per check, so ~100 s in a row before it is declared
    #   dead.
    "RAY_health_check_failure_threshold": "10",
    "RAY_health_check_period_ms": "200",
    # - actor_graceful_shutdown_timeout_ms: when an actor's owner dies (a kernel killed with
    #   `kill -9` owns Ray Train's controller, which owns the workers), the GCS asks the actor to
    #   exit gracefully: it exits once its running tasks end, and is killed only after this
    #   timeout (default 30 s). A training loop never ends by itself, so a killed kernel's run
    #   held its slice 19-25 s on a busy machine. 2 s: the run's actors go within ~2 s of their
    #   owner, and the placement groups (removed when their creator job and actor are dead)
    #   with them.
    "RAY_actor_graceful_shutdown_timeout_ms": "2000",
    # No idle worker prestarted on every node when a driver connects (~43 MB a host).
    "RAY_prestart_worker_first_driver": "0",
}



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
        group.write(own_autogroup_nice())
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
