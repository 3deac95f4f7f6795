"""A kernel that exits without ``%raytpu down`` leaves no emulated cluster and no process behind."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import psutil

from raytpu_lab.cluster import emulator

SCRIPT = textwrap.dedent("""
    from raytpu_lab import get_lab
    lab = get_lab()
    lab.up("v5litepod:2x2", 1, name="exit-test")
    lab.reserve("2x2", "v5litepod", name="r1")
    print("UP", flush=True)
""")  # ends without down: atexit must stop what this process started


def test_the_cluster_a_kernel_started_stops_when_it_exits() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=600)
    assert "UP" in done.stdout, done.stdout + done.stderr
    assert emulator.find("exit-test") is None
    folder = str(emulator.state_root() / "exit-test")
    left = [p.pid for p in psutil.process_iter(["cmdline"])
            if any(folder in part for part in p.info["cmdline"] or [])]
    assert not left, f"processes left: {left}"
