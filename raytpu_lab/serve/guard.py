"""A served app's guard: it deletes the app once the driver that served it is dead.

Serve applications are detached by design (they outlive the driver that deployed them). A kernel
that exits normally deletes its apps on the way out (:meth:`ServeService.delete_all` at exit), but
a kernel killed with ``kill -9`` (or lost with its machine) runs no exit hook, and its app would
hold the slice's chips until someone deletes it by hand. So each app gets a guard: a detached,
zero-CPU actor on the head node that asks the GCS every :data:`POLL_S` seconds whether the
serving driver's job is dead (Ray marks it dead as soon as the driver's connection to its raylet
drops) and then deletes the app (and Serve, when that driver had started it and no app is left),
and exits. :meth:`ServeService.delete` kills the guard first, so a deleted app leaves nothing.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import ray

from raytpu_lab import _ray_private

__all__ = ["ServeGuard", "start_guard", "stop_guard", "POLL_S", "GUARD_NAMESPACE"]

POLL_S = 0.5
"""Seconds between two looks at the serving job."""
GUARD_NAMESPACE = "raytpu"
"""Ray namespace of the guards, named ``serve-guard:<app>:<job id>``."""


@ray.remote(num_cpus=0, max_restarts=0)
class ServeGuard:
    def watch(self, app: str, job_id: str, stop_serve: bool) -> None:
        from ray import serve

        while not _ray_private.job_is_dead(job_id):
            time.sleep(POLL_S)
        try:
            serve.delete(app, _blocking=True)
            if stop_serve and not serve.status().applications:
                serve.shutdown()
        finally:  # nothing more to guard, whatever Serve said
            ray.actor.exit_actor()


def start_guard(app: str, *, stop_serve: bool) -> Any:
    """Start ``app``'s guard for this driver's job (the kernel's); returns its handle.

    Args:
        app: The Serve application to delete once this driver's job is dead.
        stop_serve: Also shut Serve down then, if no application is left (this driver started it).
    """
    job_id = ray.get_runtime_context().get_job_id()
    guard = ServeGuard.options(  # type: ignore[attr-defined]
        name=f"serve-guard:{app}:{job_id}", namespace=GUARD_NAMESPACE, lifetime="detached",
        resources={"node:__internal_head__": 0.001}).remote()
    guard.watch.remote(app, job_id, stop_serve)
    return guard


def stop_guard(guard: Any) -> None:
    """Kill a guard (its app is being deleted by its driver). Never raises."""
    with contextlib.suppress(Exception):  # already gone
        ray.kill(guard, no_restart=True)
