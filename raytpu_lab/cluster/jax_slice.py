"""JAX on an emulated TPU host sees its whole slice, as on a TPU VM.

On a TPU VM the TPU runtime forms the multi-host slice from ``TPU_WORKER_HOSTNAMES`` and
``TPU_WORKER_ID``: JAX in the process that owns the host's chips sees every device of the slice,
``jax.distributed.initialize()`` is optional (with no arguments it finds the slice itself) and a
second call is harmless. The emulator gives each host's processes a start-up hook
(``_site/sitecustomize.py``) that, when JAX is imported:

- registers :class:`EmulatedTpuSlice`, a JAX cluster environment (``jax._src.clusters``, the way
  JAX finds GKE TPU slices, SLURM or Open MPI jobs), so ``jax.distributed.initialize()`` with no
  arguments joins the slice: coordinator on worker 0 (``RAYTPU_SLICE_COORDINATOR``), one process
  per host, process id = ``TPU_WORKER_ID``;
- initialises it lazily, the first time JAX starts its backend (``jax.devices()``, a computation)
  in a process that holds all of its host's chips (a Ray task, actor, Train worker or job driver
  with ``resources={"TPU": chips per host}``), exactly as above; other processes on the host see
  only their own CPU devices (on a TPU VM they see no TPU: the chips belong to one process);
- turns a repeated ``jax.distributed.initialize()`` into a no-op when it asks for nothing else
  than what is already set up (no arguments, or the same ones), e.g. JAX's documented first line
  in a ``%%raytpu run --on`` cell whose process raytpu_lab already initialised.

A process that already set up JAX another way (Ray Train's JAX backend and ``%%raytpu run``
call ``jax.distributed.initialize`` with their own coordinator first) keeps its setup.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import Any

__all__ = ["install_import_hook", "slice_arguments", "holds_host_chips", "EMULATED_SLICE"]

EMULATED_SLICE = "raytpu_emulated_tpu_slice"
"""The JAX ``cluster_detection_method`` name of an emulated slice."""

_lock = threading.Lock()
_patched = False


def slice_arguments() -> tuple[str, int, int]:
    """``(coordinator address, processes, this process's id)`` of this host's slice."""
    ips = os.environ.get("RAYTPU_SLICE_HOST_IPS", "").split(",")
    return (os.environ["RAYTPU_SLICE_COORDINATOR"], len(ips),
            int(os.environ.get("TPU_WORKER_ID", "0")))


def holds_host_chips() -> bool:
    """Whether this process holds every TPU chip of its host (a Ray worker assigned them all)."""
    chips = int(os.environ.get("RAYTPU_CHIPS_PER_HOST", "0") or 0)
    if chips <= 0 or "ray" not in sys.modules:
        return False
    try:
        import ray

        if not ray.is_initialized():
            return False
        ids = ray.get_runtime_context().get_accelerator_ids().get("TPU", [])
    except Exception:
        return False
    return len(ids) >= chips


def _join_slice(real_initialize: Any) -> None:
    """``jax.distributed.initialize`` for this host's slice. Worker 0's coordinator binds only its
    host's own address (JAX's default binds every address, where another cluster's process may
    hold the port), as a TPU VM's own IP."""
    coordinator, count, pid = slice_arguments()
    real_initialize(coordinator, count, pid, coordinator_bind_address=coordinator)


def _patch_jax() -> None:
    global _patched
    with _lock:
        if _patched:
            return
        _patched = True
    import jax
    from jax._src import distributed, xla_bridge
    from jax._src.clusters import ClusterEnv

    class EmulatedTpuSlice(ClusterEnv):
        """An emulated TPU slice: what JAX's GKE TPU environment finds on a real one."""

        name = EMULATED_SLICE

        @classmethod
        def is_env_present(cls) -> bool:
            return bool(os.environ.get("RAYTPU_SLICE_COORDINATOR")) and holds_host_chips()

        @classmethod
        def get_coordinator_address(cls, timeout_secs: int | None,
                                    override_coordinator_port: str | None = None) -> str:
            address = slice_arguments()[0]
            if override_coordinator_port:
                address = f"{address.rsplit(':', 1)[0]}:{override_coordinator_port}"
            return address

        @classmethod
        def get_process_count(cls) -> int:
            return slice_arguments()[1]

        @classmethod
        def get_process_id(cls) -> int:
            return slice_arguments()[2]

        @classmethod
        def get_local_process_id(cls) -> int | None:
            return None

    real_initialize = jax.distributed.initialize
    real_backends = xla_bridge.backends

    def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
                   process_id: int | None = None, *args: Any, **kwargs: Any) -> None:
        state = distributed.global_state
        if state.client is not None and not args and not kwargs:
            asked = (coordinator_address, num_processes, process_id)
            have = (state.coordinator_address, state.num_processes, state.process_id)
            if all(a is None or a == h for a, h in zip(asked, have, strict=True)):
                return  # already part of this cluster: a no-op, as on a TPU VM
        if (coordinator_address, num_processes, process_id) == (None, None, None) \
                and not args and not kwargs and state.client is None \
                and EmulatedTpuSlice.is_env_present():
            _join_slice(real_initialize)  # what JAX's auto-detection would do, bound to this host
            return
        real_initialize(coordinator_address, num_processes, process_id, *args, **kwargs)

    initialize.__doc__ = real_initialize.__doc__
    initialize.__wrapped__ = real_initialize  # type: ignore[attr-defined]

    def backends() -> Any:
        if not xla_bridge.backends_are_initialized() and distributed.global_state.client is None \
                and EmulatedTpuSlice.is_env_present():
            _join_slice(real_initialize)
        return real_backends()

    jax.distributed.initialize = initialize
    xla_bridge.backends = backends


class _AfterJax(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs :func:`_patch_jax` right after ``jax`` is imported."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "jax":
            return None
        sys.meta_path.remove(self)  # once: find the real spec without this finder
        spec = importlib.util.find_spec("jax")
        if spec is None or spec.loader is None:
            return None
        real_loader = spec.loader

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
                return real_loader.create_module(spec)

            def exec_module(self, module: ModuleType) -> None:
                real_loader.exec_module(module)
                try:
                    _patch_jax()
                except Exception:
                    pass

        spec.loader = _Loader()
        return spec


def install_import_hook() -> None:
    """Patch JAX when it is imported (at once if it already is)."""
    if "jax" in sys.modules:
        _patch_jax()
    elif not any(isinstance(f, _AfterJax) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterJax())
