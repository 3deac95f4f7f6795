"""Finding, signalling and sweeping the processes of an emulated cluster.

A node is tracked by the process-group id of its ``ray start`` (a new session per node); Ray
daemons that left their group are found by :data:`FOLDER_ENV` in their environment.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import psutil

__all__ = ["FOLDER_ENV", "pid_alive", "group_alive", "signal_group", "wait_groups_gone",
           "in_cluster", "kill_strays"]

FOLDER_ENV = "RAYTPU_EMULATED_CLUSTER"
"""Set to the cluster's folder in every process of an emulated node: Ray's daemons rename
themselves (``ray::DashboardAgent``) and can leave their process group, so the stray sweep finds
them by this variable rather than by command line."""



def pid_alive(pid: int) -> bool:
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
