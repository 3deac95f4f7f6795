"""Real clusters get this package shipped to their workers (Ray Train workers run our taps)."""

from __future__ import annotations

from pathlib import Path

import raytpu_lab
from raytpu_lab.cluster.connect import job_runtime_env


def test_emulated_clusters_need_no_runtime_env() -> None:
    assert job_runtime_env(False) is None


def test_real_clusters_get_the_package_directory_as_py_modules() -> None:
    env = job_runtime_env(True)
    assert env is not None
    (path,) = env["py_modules"]
    assert Path(path) == Path(raytpu_lab.__file__).parent
    assert (Path(path) / "train" / "worker_tap.py").is_file()  # what Ray Train workers import
