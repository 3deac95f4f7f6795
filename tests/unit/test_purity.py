"""The pure core imports no Ray, IPython or network library (checked in a fresh interpreter)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = ("ray", "IPython", "ipykernel", "requests", "urllib3", "httpx", "aiohttp", "grpc")


PURE_MODULES = [
    "raytpu_lab._protocols",
    "raytpu_lab.advice",
    "raytpu_lab.tpu",
    "raytpu_lab.tpu.generations",
    "raytpu_lab.tpu.labels",
    "raytpu_lab.tpu.topology",
    "raytpu_lab.tpu.unknown",
    "raytpu_lab.serve",
    "raytpu_lab.serve.plan",
    "raytpu_lab.serve.loadstats",
    "raytpu_lab.widgets.serve_panel",
    "raytpu_lab.state",
    "raytpu_lab.state.model",
    "raytpu_lab.state.snapshot",
    "raytpu_lab.state.planned",
    "raytpu_lab.state.synthetic",
    "raytpu_lab.state.usage",
    "raytpu_lab.reservations",
    "raytpu_lab.reservations.info",
    "raytpu_lab.widgets.svg",
    "raytpu_lab.train.profile",
    "raytpu_lab.train.protocols",
    "raytpu_lab.train.result",
    "raytpu_lab.train.attempts",
    "raytpu_lab.train.spec",
    "raytpu_lab.train.profile_analysis",
    "raytpu_lab.train.xla_profile",
    "raytpu_lab.widgets.xla_view",
    "raytpu_lab.reservations.check_report",
    "raytpu_lab.train.goodput",
    "raytpu_lab.train.mfu",
    "raytpu_lab.widgets.goodput_svg",
]

_CHECK = """
import importlib, sys
importlib.import_module({module!r})
loaded = sorted({{name.split(".")[0] for name in sys.modules}} & set({forbidden!r}))
assert not loaded, f"{module} pulled in {{loaded}}"
"""


@pytest.mark.parametrize("module", PURE_MODULES)
def test_imports_nothing_heavy(module: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    result = subprocess.run(
        [sys.executable, "-c", _CHECK.format(module=module, forbidden=FORBIDDEN)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
