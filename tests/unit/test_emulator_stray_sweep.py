"""The emulator's stray sweep finds a node's daemons by their environment, not their name.

Ray's daemons rename themselves (``ray::DashboardAgent``) and can outlive their process group after a
failed start; their command line then no longer names the cluster's folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from raytpu_lab.cluster import _process_groups


def test_a_renamed_process_of_the_cluster_is_killed_and_others_are_not(tmp_path) -> None:
    folder = str(tmp_path / "c1")
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    ours = subprocess.Popen(sleeper, env={**os.environ, _process_groups.FOLDER_ENV: folder})
    other = subprocess.Popen(sleeper, env={**os.environ, _process_groups.FOLDER_ENV: folder + "-other"})
    try:
        _process_groups.kill_strays(folder)
        deadline = time.monotonic() + 10
        while ours.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ours.poll() is not None, "the cluster's process survived the sweep"
        assert other.poll() is None, "another cluster's process was killed"
    finally:
        for p in (ours, other):
            p.kill()
            p.wait()
