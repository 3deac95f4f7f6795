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


def test_train_modules_export_what_they_define_and_no_dead_launchers() -> None:
    import importlib

    names = ["launch", "run", "result", "spec", "service", "protocols", "torch_run", "profile"]
    for short in names:
        module = importlib.import_module(f"raytpu_lab.train.{short}")
        missing = [n for n in module.__all__ if not hasattr(module, n)]
        assert not missing, (short, missing)
    exported = {n for short in names
                for n in importlib.import_module(f"raytpu_lab.train.{short}").__all__}
    assert not exported & {"launch_jax", "launch_run", "launch_torch", "check_torch_run"}
    from raytpu_lab.train.profile import ProfileWindow
    from raytpu_lab.train.run import RunHandle

    assert not hasattr(RunHandle, "stop_requested") and not hasattr(ProfileWindow, "num_steps")
