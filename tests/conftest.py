"""Fixtures shared by the notebook and browser tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def quickstart_build(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """Run the quickstart notebook headless once, as `make demo` does (its own emulated cluster).

    Returns ``{"out": folder with quickstart.ipynb/.html, "result": the RESULT dict, "log": text}``.
    """
    out = tmp_path_factory.mktemp("quickstart")
    # A private emulator state root: the notebook's `%raytpu up` never meets a user's own cluster.
    # Short: Ray's Unix socket paths under it are limited to 107 bytes.
    emulators = Path(tempfile.mkdtemp(prefix="rtq-", dir="/tmp"))
    env = {**os.environ, "RAYTPU_EMULATOR_ROOT": str(emulators)}
    proc = subprocess.run([sys.executable, "-m", "raytpu_lab.demo", "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT "), log[-4000:]
    yield {"out": out, "emulators": emulators, "log": log,
           "result": json.loads(last[len("RESULT "):])}
    shutil.rmtree(emulators, ignore_errors=True)
