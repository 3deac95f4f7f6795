"""Pure helpers of the emulator's node start (no Ray started)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from raytpu_lab.cluster import _addresses, _node_checks, _nodes, _priority


@pytest.mark.parametrize(("log", "needle"), [
    ("Exception: The current node timed out during startup. This could ...", "30 s registration"),
    ("Check failed ... Timed out waiting for file /tmp/x/metrics_agent_port_abc", "agents started too slowly"),
    ("Failed to read dashboard.err file", "agents started too slowly"),
    ("Usage: ray start [OPTIONS]\nError: No such option '--x'", "refused an argument"),
    ("OSError: [Errno 98] Address already in use", "port was taken"),
])
def test_likely_cause_names_what_the_logs_show(log: str, needle: str) -> None:
    assert needle in _node_checks.likely_cause(log)


def test_every_host_of_a_pod_gets_its_own_loopback_address() -> None:
    prefix = _addresses.loopback_prefix()
    assert re.fullmatch(r"127\.\d{1,3}\.", prefix) and prefix != "127.0."
    ips = [_addresses.host_ip(prefix, i) for i in range(4096)]
    assert len(set(ips)) == 4096
    assert all(0 < int(ip.rsplit(".", 1)[1]) < 255 for ip in ips)


def test_free_ports_bind_on_a_hosts_own_address() -> None:
    ports = _addresses.free_ports(6, "127.9.0.1")
    assert len(set(ports)) == 6 and all(p > 0 for p in ports)


def test_a_starting_node_runs_at_raised_priority_and_is_set_back_once_up() -> None:
    import os
    import subprocess

    import psutil

    from raytpu_lab.cluster import _launcher

    proc = subprocess.Popen(["sleep", "30"], start_new_session=True,
                            preexec_fn=lambda: _launcher._raise_priority(_priority.START_NICE))
    try:
        raised = os.geteuid() == 0  # lowering nice needs root (CAP_SYS_NICE); else unchanged
        assert psutil.Process(proc.pid).nice() == (_priority.START_NICE if raised else 0)
        if raised:
            assert f"nice {_priority.START_NICE}" in Path(f"/proc/{proc.pid}/autogroup").read_text()
        _priority.normal_priority(_nodes.NodeSpec("x", {}, [], "127.0.0.1", pgid=proc.pid,
                                               raylet_pid=proc.pid))
        assert psutil.Process(proc.pid).nice() == 0
        if raised:
            assert "nice 0" in Path(f"/proc/{proc.pid}/autogroup").read_text()
    finally:
        proc.kill()
        proc.wait()
