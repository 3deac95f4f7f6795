"""Ray Serve deployments on a reservation's slices: deploy, status, delete (the Ray-facing part).

:meth:`ServeService.deploy` checks the deployment against the reservation
(:func:`raytpu_lab.serve.plan.plan_deployment`, pure), stops the reservation's host processes, and
lends its chips: the reservation's slice placement group is removed while its head locks stay
(:func:`raytpu_lab.reservations.slices.lend_chips`), so no other ``reserve``, training run or
``slice_placement_group`` can take the slices (they all claim the head first) while the
deployment's replicas, pinned to the slices by label, take the chips. Ray Serve places each
replica's placement group itself (``placement_group_bundles`` +
``placement_group_bundle_label_selector``, Ray 2.60); nothing here places anything.

Serve is started (if no Serve runs on the cluster) with one HTTP proxy on the head node, bound
to ``127.0.0.1`` on a free port. :meth:`ServeService.delete` deletes the app, waits until its
placement groups are gone, gives the chips back to the reservation (or leaves them free when the
reservation is being released), and shuts Serve down when it started it and no app is left.
A kernel killed before it could delete its apps (``kill -9``) leaves them to their guards
(:mod:`raytpu_lab.serve.guard`), which delete them once Ray says its driver is dead.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raytpu_lab import _ray_private
from raytpu_lab.advice import cmd, opt
from raytpu_lab.errors import ServeError
from raytpu_lab.serve.chatter import is_serve_chatter
from raytpu_lab.serve.guard import start_guard, stop_guard
from raytpu_lab.serve.plan import ServePlan, plan_deployment
from raytpu_lab.state import fetch
from raytpu_lab.tpu.labels import LABEL_SLICE, LABEL_WORKER

if TYPE_CHECKING:
    from raytpu_lab.reservations.service import ReservationService
    from raytpu_lab.session.reader import StateReader

__all__ = ["ServedApp", "ServeService"]


@dataclass
class ServedApp:
    """A Serve application running on a reservation's slices.

    Attributes:
        app: Application name.
        reservation: The reservation lending its slices.
        deployment: The deployment's name.
        url: ``http://127.0.0.1:<port><route>``.
        plan: Where its replicas run (slices, bundles).
        replica_hosts: ``"<slice> worker <id>"`` of each replica actor's host.
        placement_groups: The replicas' placement group ids (hex).
        started_at: Seconds since the epoch.
    """

    app: str
    reservation: str
    deployment: str
    url: str
    plan: ServePlan
    replica_hosts: list[str] = field(default_factory=list)
    placement_groups: list[str] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)
    guard: Any = field(default=None, repr=False)
    """Its :mod:`~raytpu_lab.serve.guard` actor (deletes it if this kernel dies)."""

    @property
    def label(self) -> str:
        """``"serve: <app>"``, as the map shows its slices and placement groups."""
        return f"serve: {self.app}"


class ServeService:
    """The Serve applications one session runs on its reservations, by app name.

    Args:
        reservations: Where reservations are looked up.
        reader: Reads the cluster (nodes' labels for where replicas landed).
        close_hosts: Stops a reservation's host processes (they hold its chips).
        on_served: Called as ``(label, slice names, placement group ids)`` once an app runs.
        on_deleted: Called with the label when an app is gone.
    """

    def __init__(self, reservations: ReservationService, reader: StateReader, *,
                 close_hosts: Callable[[str], None] = lambda name: None,
                 on_served: Callable[[str, list[str], list[str]], None] = lambda *a: None,
                 on_deleted: Callable[[str], None] = lambda label: None) -> None:
        self.reservations = reservations
        self.reader = reader
        self.close_hosts = close_hosts
        self.on_served = on_served
        self.on_deleted = on_deleted
        self.apps: dict[str, ServedApp] = {}
        self.started_serve = False
        self._exit_hook = False
        self._mute: contextlib.AbstractContextManager[None] | None = None  # see deploy

    def deploy(self, reservation: str, target: Any, *, app: str | None = None,
               route: str | None = None, replicas: int = 1,
               init_kwargs: Mapping[str, Any] | None = None,
               timeout_s: float = 120.0) -> ServedApp:
        """Serve ``target`` (a class, or a ``@serve.deployment`` of one) on reservation
        ``reservation``'s slices: one whole slice per replica.

        Args:
            reservation: A reservation of this session.
            target: The deployment class or ``ray.serve.Deployment``.
            app: Application name (default: the class name, lower case).
            route: HTTP route prefix (default ``/<app>``).
            replicas: Replicas, one slice each (at most the reservation's slices).
            init_kwargs: Keyword arguments for the class's ``__init__``.
            timeout_s: Seconds to wait for every replica to run.

        Returns:
            The running app (``.url`` answers HTTP).

        Raises:
            ReservationError: No reservation of that name in this session.
            ServeError: Refused before deploying (app name in use, the reservation serves
                already, chips or tensor_parallel_size not matching a slice; nothing started),
                or the replicas failed to start or were not placed within ``timeout_s`` (the
                failing replica's host and traceback in ``.host`` / ``.traceback``; the app was
                deleted and the chips given back to the reservation).
        """
        from ray import serve
        from ray.serve.deployment import Deployment

        res = self.reservations.get(reservation)
        self.reader.require("serve a deployment")
        deployment = target if isinstance(target, Deployment) else None
        cls = deployment.func_or_class if deployment is not None else target
        if not isinstance(cls, type):
            raise ServeError(f"{target!r} is not a class.",
                             why="A deployment served on a slice is a class (as Ray Serve users "
                                 "write it), constructed once per replica.",
                             fix="Define a class with __init__ and __call__.")
        app = app or cls.__name__.lower()
        for other in self.apps.values():
            if other.app == app:
                raise ServeError(f"An app named {app!r} runs already (on {other.reservation!r}).",
                                 fix=("Pick another name (", opt("app", f"{app}2"), ") or delete it: ",
                                      cmd("serve-delete", app)))
            if other.reservation == reservation:
                raise ServeError(f"Reservation {reservation!r} serves {other.app!r} already.",
                                 why="A replica holds a whole slice.",
                                 fix=("Delete it first (", cmd("serve-delete", other.app), ")."))
        options = _options_of(deployment)
        plan = plan_deployment(reservation=reservation, slice_names=res.slice_names,
                               hosts_per_slice=res.shape.num_hosts,
                               chips_per_host=res.shape.chips_per_host,
                               pod_type=res.shape.pod_type, app=app, route=route or f"/{app}",
                               replicas=replicas, options=options, init_kwargs=init_kwargs)
        base: Any = deployment if deployment is not None else serve.deployment(cls)
        bound = base.options(**plan.deployment_options()).bind(**dict(init_kwargs or {}))
        if self._mute is None:  # for the session's life: Serve's actors outlive any one cell
            self._mute = _ray_private.muted_worker_logs(is_serve_chatter)
            self._mute.__enter__()
        with _driver_serve_logs_quiet():
            port = self._ensure_serve()
        if not self._exit_hook:
            # Registered after ray.init's own exit handler, so it runs first (atexit is LIFO),
            # while the driver is still connected: Serve apps are detached and would outlive it.
            atexit.register(self.delete_all, quiet=True)
            self._exit_hook = True
        self.close_hosts(reservation)
        from raytpu_lab.reservations.slices import lend_chips

        lend_chips(res)
        res.lent_to = f"serve app {app}"
        served = ServedApp(app=app, reservation=reservation, deployment=base.name,
                           url=f"http://127.0.0.1:{port}{plan.route}", plan=plan)
        self.apps[app] = served
        served.guard = start_guard(app, stop_serve=self.started_serve)
        try:
            with _driver_serve_logs_quiet():
                serve.run_many([serve.RunTarget(bound, name=app, route_prefix=plan.route)],
                               wait_for_applications_running=False)
            self._wait_running(served, timeout_s)
        except BaseException:
            self.delete(app)
            raise
        self.on_served(served.label, plan.slice_names, served.placement_groups)
        return served

    def status(self, app: str) -> dict[str, Any]:
        """Serve's view of ``app`` now: ``{"app", "status", "message", "url", "reservation",
        "deployments": {name: {"status", "running", "target", "replica_states"}}}``.

        Raises:
            ServeError: This session runs no app of that name.
        """
        served = self._get(app)
        info: dict[str, Any] = fetch.fetch_serve_status().get(app, {})
        deps: dict[str, Any] = {}
        for name, d in dict(info.get("deployments") or {}).items():
            states = dict(d.get("replica_states") or {})
            deps[name] = {"status": d.get("status", ""), "running": states.get("RUNNING", 0),
                          "target": served.plan.replicas, "replica_states": states}
        return {"app": app, "status": info.get("status", "gone"), "message": info.get("message", ""),
                "url": served.url, "reservation": served.reservation, "deployments": deps,
                "replica_hosts": list(served.replica_hosts)}

    def load(self, app: str, *, rps: float, duration_s: float, concurrency: int = 8,
             payload: Any = None, on_tick: Callable[[Any], None] | None = None) -> Any:
        """Send a bounded load to ``app`` (see :func:`raytpu_lab.serve.load.run_load`).

        Returns:
            The :class:`~raytpu_lab.serve.loadstats.LoadStats` of every request sent.

        Raises:
            ServeError: This session runs no app of that name.
            RaytpuError: ``rps``, ``duration_s`` or ``concurrency`` not positive.
        """
        from raytpu_lab.serve.load import run_load

        served = self._get(app)
        return run_load(served.url, rps=rps, duration_s=duration_s, concurrency=concurrency,
                        payload=payload, on_tick=on_tick)

    def delete(self, app: str, *, give_back: bool = True, timeout_s: float = 60.0) -> None:
        """Delete ``app``: Serve removes its replicas and their placement groups (waited for, at
        most ``timeout_s`` seconds); the reservation takes its chips back (``give_back``; not
        when it is being released); Serve is shut down if this session started it and no app is
        left on the cluster.

        Raises:
            ServeError: This session runs no app of that name, or the reservation could not take
                its chips back (another driver took them; the reservation keeps its head locks).
        """
        from ray import serve

        served = self._get(app)
        stop_guard(served.guard)
        with _driver_serve_logs_quiet():
            serve.delete(app, _blocking=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            states = fetch.fetch_placement_group_states()
            if all(states.get(pg, {}).get("state") in (None, "REMOVED")
                   for pg in served.placement_groups):
                break
            time.sleep(0.2)
        del self.apps[app]
        self.on_deleted(served.label)
        res = self.reservations.held.get(served.reservation)
        took_back = True
        if res is not None:
            res.lent_to = ""
            if give_back:
                from raytpu_lab.reservations.slices import retake_chips

                took_back = retake_chips(res, timeout_s=30.0)
        if self.started_serve and not self.apps and not fetch.fetch_serve_status():
            with _driver_serve_logs_quiet():
                serve.shutdown()
            self.started_serve = False
        if not took_back:
            raise ServeError(f"App {app!r} is deleted, but reservation {served.reservation!r} could "
                             "not take its chips back within 30 s.",
                             why="Something else took the slice's chips once the replicas freed them.",
                             fix=("Release it (", cmd("release", served.reservation), ") and reserve again."))

    def delete_for(self, reservation: str, *, give_back: bool = False) -> None:
        """Delete every app served on ``reservation`` (before it is released: ``give_back``
        ``False``)."""
        for served in [a for a in self.apps.values() if a.reservation == reservation]:
            self.delete(served.app, give_back=give_back)

    def delete_all(self, *, quiet: bool = False) -> None:
        """Delete every app of this session without giving the chips back (kernel exit: the
        reservations go with the driver); ``quiet``: ignore errors (the cluster may be gone)."""
        for app in list(self.apps):
            try:
                self.delete(app, give_back=False, timeout_s=10.0)
            except Exception:
                if not quiet:
                    raise

    def _get(self, app: str) -> ServedApp:
        served = self.apps.get(app)
        if served is None:
            raise ServeError(f"No app named {app!r} in this session.",
                             why=f"Apps served: {', '.join(self.apps) or 'none'}.",
                             fix=("Serve one on a reservation: ", cmd("serve", "..."), "."))
        return served

    def _ensure_serve(self) -> int:
        from ray import serve

        port = _ray_private.serve_http_port()
        if port is not None:
            return port
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
        self.started_serve = True
        return port

    def _wait_running(self, served: ServedApp, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            info: dict[str, Any] = fetch.fetch_serve_status().get(served.app, {})
            status = info.get("status")
            if status == "RUNNING":
                break
            if status == "DEPLOY_FAILED":
                raise self._failure(served, info)
            if time.monotonic() > deadline:
                raise ServeError(
                    f"App {served.app!r} did not start within {timeout_s:.0f} s ({status}); it was "
                    "deleted and the chips given back.",
                    why=str(info.get("message") or "Its replicas were not placed: something else "
                            "holds the slice's chips."),
                    fix=("Check ", cmd("status"), " and serve again."))
            time.sleep(0.25)
        nodes = {n["node_id"]: n.get("labels") or {} for n in self.reader.raw()["nodes"]}
        replicas = [r for r in fetch.fetch_serve_replicas(served.app) if r["state"] == "ALIVE"]
        served.placement_groups = sorted({r["placement_group_id"] for r in replicas
                                          if r["placement_group_id"]})
        served.replica_hosts = [_host_of(nodes.get(r["node_id"], {})) for r in replicas]
        off = [h for r, h in zip(replicas, served.replica_hosts, strict=True)
               if nodes.get(r["node_id"], {}).get(LABEL_SLICE) not in served.plan.slice_names]
        if off:
            raise ServeError(f"Replicas of {served.app!r} landed off the reservation's slices: "
                             f"{', '.join(off)}; the app was deleted.",
                             why=f"Expected only {', '.join(served.plan.slice_names)}.",
                             fix="Report it: the bundle label selector should prevent this.")

    def _failure(self, served: ServedApp, info: Mapping[str, Any]) -> ServeError:
        nodes = {n["node_id"]: n.get("labels") or {} for n in self.reader.raw()["nodes"]}
        replicas = fetch.fetch_serve_replicas(served.app)
        hosts = sorted({_host_of(nodes.get(r["node_id"], {})) for r in replicas if r["node_id"]})
        messages = [str(d.get("message") or "") for d in dict(info.get("deployments") or {}).values()]
        text = next((m for m in messages if "Traceback" in m), "") or str(info.get("message") or "")
        tb = text[text.find("Traceback"):] if "Traceback" in text else text
        where = ", ".join(hosts) or "no host"
        return ServeError(f"App {served.app!r} failed to start on {where}: its replica raised in "
                          "__init__; it was deleted and the chips given back.",
                          why=tb.strip() or "Serve gave no message.",
                          fix="Fix the class and serve again.", host=where, traceback=tb)


@contextlib.contextmanager
def _driver_serve_logs_quiet() -> Iterator[None]:
    """Serve's driver-side logger (``ray.serve``) at WARNING for the block: its INFO lines
    ("Started Serve in namespace...", "Deleting app...") say what the cell prints anyway."""
    logger = logging.getLogger("ray.serve")
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        logger.setLevel(level)


def _host_of(labels: Mapping[str, str]) -> str:
    return f"{labels.get(LABEL_SLICE, '?')} worker {labels.get(LABEL_WORKER, '?')}"


def _options_of(deployment: Any) -> dict[str, Any]:
    """The options a ``@serve.deployment(...)`` set that the checks read."""
    if deployment is None:
        return {}
    replica = getattr(deployment, "_replica_config", None)
    return {"ray_actor_options": dict(deployment.ray_actor_options or {}),
            "user_config": deployment.user_config,
            "placement_group_bundles": list(getattr(replica, "placement_group_bundles", None) or [])}
