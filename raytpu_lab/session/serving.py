"""The session's serving methods: Ray Serve deployments on reservations, over the session's
:class:`~raytpu_lab.serve.service.ServeService` (``self.serving``). Kept apart from
:class:`raytpu_lab.lab.Session` only for size; these are the public API (``lab.serve(...)``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from raytpu_lab.serve.loadstats import LoadStats
from raytpu_lab.serve.service import ServedApp, ServeService

__all__ = ["ServingMethods"]


class ServingMethods:
    """Mixed into :class:`~raytpu_lab.lab.Session`: ``serve``, ``serve_status``, ``serve_load``, ``serve_delete``,
    ``served``."""

    serving: ServeService

    def serve(self, reservation: str, target: Any, *, app: str | None = None,
              route: str | None = None, replicas: int = 1,
              init_kwargs: Mapping[str, Any] | None = None,
              timeout_s: float = 120.0) -> ServedApp:
        """Serve a deployment class on reservation ``reservation``'s slices (one whole slice per
        replica, HTTP on ``127.0.0.1``); the reservation keeps its slices' head locks, so no
        other reservation or run can take them while it serves. See
        :meth:`raytpu_lab.serve.service.ServeService.deploy`."""
        return self.serving.deploy(reservation, target, app=app, route=route, replicas=replicas,
                                   init_kwargs=init_kwargs, timeout_s=timeout_s)

    def serve_status(self, app: str) -> dict[str, Any]:
        """Serve's state of ``app`` (status, replicas running/target, URL). See
        :meth:`raytpu_lab.serve.service.ServeService.status`."""
        return self.serving.status(app)

    def serve_load(self, app: str, *, rps: float, duration_s: float, concurrency: int = 8,
                   payload: Any = None, on_tick: Callable[[LoadStats], None] | None = None,
                   ) -> LoadStats:
        """Send ``rps`` requests per second to ``app`` for ``duration_s`` seconds (at most
        ``concurrency`` in flight; ``payload`` JSON-able, POSTed; GET if ``None``); returns
        per-request samples, per-second windows and the summary (p50/p90/p99 seconds). See
        :meth:`raytpu_lab.serve.service.ServeService.load`."""
        stats: LoadStats = self.serving.load(app, rps=rps, duration_s=duration_s,
                                             concurrency=concurrency, payload=payload,
                                             on_tick=on_tick)
        return stats

    def serve_delete(self, app: str) -> None:
        """Delete ``app`` and give its slices' chips back to the reservation. See
        :meth:`raytpu_lab.serve.service.ServeService.delete`."""
        self.serving.delete(app)

    def served(self) -> list[ServedApp]:
        """The apps this session serves, oldest first."""
        return list(self.serving.apps.values())
