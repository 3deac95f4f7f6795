"""The public surface, guarded as httpx's tests/test_exported_members.py does: what the package
exports is a decision recorded here, and every module's ``__all__`` names only what it has."""

from __future__ import annotations

import importlib
import pkgutil

import raytpu_lab

#: `import raytpu_lab`: the error family, the kernel's session and the IPython extension hook.
PACKAGE_SURFACE = [
    "ConnectError", "EmulatorError", "InvalidTopologyError", "KubernetesError", "ManifestError",
    "NoSliceAvailableError", "NotConnectedError", "RaytpuError", "RemoteHostError",
    "ReservationError", "ServeError", "TrainingConfigError", "TrainingError", "get_lab",
    "load_ipython_extension",
]

#: The magics package: the magic, its parser and what a --background cell leaves behind.
MAGICS_SURFACE = ["RaytpuMagics", "WatchedRun", "build_parser"]

#: The session module: the facade under both names, and the kernel's one session.
LAB_SURFACE = ["Lab", "Session", "get_lab", "use_session"]

# What a module may hold without exporting it: import machinery and typing helpers.
_NOT_MEMBERS = {"annotations", "TYPE_CHECKING", "Any"}


def test_the_package_exports_exactly_its_surface() -> None:
    assert raytpu_lab.__all__ == PACKAGE_SURFACE
    public = sorted(n for n in vars(raytpu_lab) if not n.startswith("_") and n not in _NOT_MEMBERS
                    and not isinstance(getattr(raytpu_lab, n), type(raytpu_lab)))
    assert public == sorted(PACKAGE_SURFACE)


def test_the_magics_and_the_session_export_their_surface() -> None:
    from raytpu_lab import lab, magics

    assert sorted(magics.__all__) == MAGICS_SURFACE
    assert sorted(lab.__all__) == LAB_SURFACE
    assert lab.Lab is lab.Session


def test_every_modules_all_names_what_it_has() -> None:
    """No module exports a name it does not define or import (a stale ``__all__`` after a move)."""
    stale = {}
    for info in pkgutil.walk_packages(raytpu_lab.__path__, "raytpu_lab."):
        if info.name.endswith(("_site.sitecustomize", "._agent_shim")):
            continue  # start-up hooks of emulated hosts' processes, never imported here
        module = importlib.import_module(info.name)
        missing = [n for n in getattr(module, "__all__", []) if not hasattr(module, n)]
        if missing:
            stale[info.name] = missing
    assert stale == {}
