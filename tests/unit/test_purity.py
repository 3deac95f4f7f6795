"""The pure core imports no Ray, IPython or network library (checked in a fresh interpreter)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = ("ray", "IPython", "ipykernel", "requests", "urllib3", "httpx", "aiohttp", "grpc")


def _present(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


# raytpu_lab.state.model is written separately; it is held to the same rule once it exists.
PURE_MODULES = [
    "raytpu_lab.tpu",
    "raytpu_lab.tpu.topology",
    *[m for m in ("raytpu_lab.state.model",) if _present(m)],
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
