"""Start-up hook of every Python process on an emulated TPU host (on ``PYTHONPATH`` there only).

Cheap on purpose (Ray's agents run it too): it loads ``jax_slice.py`` by path, without importing
the ``raytpu_lab`` package, and only registers an import hook that, when JAX is imported, lets
JAX see the whole emulated slice (:mod:`raytpu_lab.cluster.jax_slice`).
"""

import os

if os.environ.get("RAYTPU_SLICE_COORDINATOR"):
    try:
        import importlib.util as _util
        import sys as _sys

        _path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "jax_slice.py")
        _spec = _util.spec_from_file_location("_raytpu_jax_slice", _path)
        if _spec is not None and _spec.loader is not None:
            _module = _util.module_from_spec(_spec)
            _sys.modules["_raytpu_jax_slice"] = _module
            _spec.loader.exec_module(_module)
            _module.install_import_hook()
    except Exception:  # never break a process's start for the sake of the emulation
        pass
