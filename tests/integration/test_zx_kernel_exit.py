"""A kernel that exits without ``%raytpu down`` leaves no emulated cluster and no process behind."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import psutil

from raytpu_lab.cluster import _process_groups, emulator

SCRIPT = textwrap.dedent("""
    from raytpu_lab import get_lab
    lab = get_lab()
    lab.up("v5litepod:2x2", 1, name="exit-test")
    lab.reserve("2x2", "v5litepod", name="r1")
    print("UP", flush=True)
""")  # ends without down: atexit must stop what this process started


def _left(folder: str) -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline", "status"])
            if p.info["status"] != psutil.STATUS_ZOMBIE
            and (any(folder in part for part in p.info["cmdline"] or [])
                 or _process_groups.in_cluster(p.pid, folder))]


def test_the_cluster_a_kernel_started_stops_when_it_exits() -> None:
    """The exiting process hands the stop to a process of its own (Jupyter kills a kernel that
    is slow to exit): the cluster is gone within seconds of the exit, not at once."""
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=600)
    assert "UP" in done.stdout, done.stdout + done.stderr
    exited = time.monotonic()
    folder = str(emulator.state_root() / "exit-test")
    while (emulator.find("exit-test") is not None or _left(folder)) \
            and time.monotonic() - exited < 20.0:
        time.sleep(0.2)
    assert emulator.find("exit-test") is None
    assert not (left := _left(folder)), f"processes left: {left}"
    print(f"cluster gone {time.monotonic() - exited:.1f} s after the process exited")
