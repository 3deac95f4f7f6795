"""The package's public surface: what `import raytpu_lab` exports, without loading Ray."""

from __future__ import annotations

import subprocess
import sys

import raytpu_lab
from raytpu_lab import errors


def test_every_error_is_exported_from_the_package() -> None:
    assert set(errors.__all__) <= set(raytpu_lab.__all__)
    for name in raytpu_lab.__all__:
        assert getattr(raytpu_lab, name) is not None


def test_importing_the_package_does_not_load_ray_or_ipython() -> None:
    code = "import raytpu_lab, sys; print(sorted(m for m in ('ray', 'IPython') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
