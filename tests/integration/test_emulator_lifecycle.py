"""up/down of a small separate emulated cluster: nothing left behind, names never cross."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest

from raytpu_lab.cluster import emulator


def _processes_under(folder: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if any(folder in part for part in p.info["cmdline"] or []):
            found.append(p)
    return found


def _agents_of(cluster: emulator.EmulatedCluster) -> list[psutil.Process]:
    """The live Ray agents the cluster's agent fork server forked."""
    try:
        server = psutil.Process(cluster.agents_pid)
        return [p for p in server.children() if p.status() != psutil.STATUS_ZOMBIE]
    except psutil.Error:
        return []


@pytest.mark.slow
def test_down_leaves_no_process_and_no_folder(cluster: emulator.EmulatedCluster) -> None:
    """Also: a host's two agents are forked by the cluster's agent fork server (sharing the
    pages of Ray's modules), and they end with their raylet (Ray's pipe-based health check)."""
    small = emulator.up([("v6e:2x2", 1)], name="raytpu-lifecycle")
    folder = str(small.folder)
    try:
        assert small.address != cluster.address
        assert emulator.find("raytpu-lifecycle") is not None
        assert _processes_under(folder)
        agents = _agents_of(small)
        names = sorted(p.name() for p in agents)
        assert names == ["ray::DashboardAgent", "ray::RuntimeEnvAgent"], names
        (host,) = small.hosts
        raylet = next(p for p in psutil.process_iter(["cmdline"])
                      if os.getpgid(p.pid) == host.pid and "raylet" in (p.info["cmdline"] or [""])[0])
        raylet.kill()
        deadline = time.monotonic() + 10.0
        while _agents_of(small) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _agents_of(small) == [], "a host's agents must end with its raylet"
    finally:
        small.down()
    assert not _processes_under(folder)
    assert emulator.find("raytpu-lifecycle") is None
    assert not small.folder.exists()
    assert emulator.find(cluster.name) is not None, "the other cluster must be untouched"


def test_a_started_cluster_runs_at_normal_cpu_priority(cluster: emulator.EmulatedCluster) -> None:
    """Nodes start at raised priority (where allowed); once up, none of them keeps it."""
    from raytpu_lab.cluster import _priority, _process_groups

    folder = str(cluster.folder)
    procs = [p for p in psutil.process_iter(["status"])
             if p.info["status"] != psutil.STATUS_ZOMBIE and _process_groups.in_cluster(p.pid, folder)]
    assert len(procs) >= 2 * len(cluster.hosts), "every host has a raylet and its agents"
    # Normal is this test process's own priority: CI jobs often run niced.
    own_nice = os.getpriority(os.PRIO_PROCESS, 0)
    # "/autogroup-1 nice 0"; empty or missing where the kernel has no autogroups (CI).
    own_group = _priority.own_autogroup_nice()
    raised = {}
    for proc in procs:
        try:
            words = Path(f"/proc/{proc.pid}/autogroup").read_text().split()
            group = words[-1] if words else own_group
            if proc.nice() < own_nice or int(group) < int(own_group):
                raised[proc.pid] = (proc.name(), proc.nice(), group)
        except (psutil.Error, OSError):
            continue
    assert not raised
