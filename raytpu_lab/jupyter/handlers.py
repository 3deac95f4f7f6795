"""The sidebar's HTTP API, under ``<base_url>/raytpu/api``: jupyter_server's auth on every
handler (``@tornado.web.authenticated``; POSTs also need the XSRF token, as every
:class:`~jupyter_server.base.handlers.APIHandler`), JSON errors (``{"message", "reason"}``).

=======================================================  ===========================================
``GET  clusters``                                        ``{"clusters": [ClusterRef.public()]}``
``POST clusters`` ``{"name", "tpu", "slices"}``          start an emulated cluster (``raytpu up``)
``DELETE clusters/<id>``                                 stop an emulated cluster (``raytpu down``)
``GET  clusters/<id>/snapshot``                          the feed's full state
``GET  clusters/<id>/updates?since=REV&timeout=S``       long poll: revisions after REV (full if
                                                         REV is unknown), waiting up to S seconds
``GET  clusters/<id>/details?slice=NAME&worker=W``       one host's details
``POST clusters/<id>/reservations/<name>/release``       release a reservation (any owner)
``POST clusters/<id>/runs/<key>/stop``                   stop a run (its kernel may be busy)
=======================================================  ===========================================
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any
from urllib.parse import unquote

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from raytpu_lab.jupyter.clusters import ClusterRef, UnknownClusterError, discover, find
from raytpu_lab.jupyter.feed import ClusterFeed
from raytpu_lab.jupyter.poller import ClusterPoller, CommandError, SubprocessSource

__all__ = ["SidebarState", "setup_handlers"]

_ID = r"(?P<cluster_id>[A-Za-z0-9_.-]+)"
_MAX_WAIT_S = 30.0


class SidebarState:
    """What the handlers share: settings and one :class:`ClusterPoller` per cluster id.

    Args:
        kuberay: RayClusters from the settings (``"NS/NAME"``).
        interval_s: Seconds between polls of a cluster.
        idle_after_s: Idle-reservation nudge threshold (seconds).
    """

    def __init__(self, kuberay: list[str] | None = None, interval_s: float = 1.0,
                 idle_after_s: float = 900.0) -> None:
        self.kuberay = list(kuberay or [])
        self.interval_s = interval_s
        self.idle_after_s = idle_after_s
        self.pollers: dict[str, ClusterPoller] = {}
        self._targets: dict[str, str] = {}

    def clusters(self) -> list[ClusterRef]:
        """Known now (the emulator's state root is read each time: cheap, a few small files)."""
        return discover(self.kuberay)

    def poller(self, cluster_id: str) -> ClusterPoller:
        """The poller of ``cluster_id`` (made on first use).

        Raises:
            UnknownClusterError: No such cluster.
        """
        ref = find(cluster_id, self.clusters())
        p = self.pollers.get(cluster_id)
        if p is not None and self._targets.get(cluster_id) != ref.target:
            # The same name, another cluster (restarted on new ports): start over.
            old, p = p, None
            asyncio.ensure_future(old.close())
        if p is None:
            p = ClusterPoller(lambda: SubprocessSource(ref.target, self.interval_s),
                              ClusterFeed(ref.expected_hosts, idle_after_s=self.idle_after_s))
            self.pollers[cluster_id] = p
            self._targets[cluster_id] = ref.target
        return p

    async def close(self) -> None:
        """Stop every poller process."""
        for p in self.pollers.values():
            await p.close()


class _Base(APIHandler):
    @property
    def sidebar(self) -> SidebarState:
        return self.settings["raytpu_sidebar"]  # type: ignore[no-any-return]

    def _poller(self, cluster_id: str) -> ClusterPoller:
        try:
            return self.sidebar.poller(cluster_id)
        except UnknownClusterError as err:
            raise tornado.web.HTTPError(404, str(err.args[0]), reason="unknown cluster") from err

    def _json(self, data: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data, separators=(",", ":")))

    async def _act_on(self, cluster_id: str, kind: str, field: str, value: str,
                      command: dict[str, Any], *, what: str, verb: str) -> str:
        """Send ``command`` to the cluster's poller once ``value`` is a known ``kind`` row
        (``field``); 404 when it is not, 409 when the poller's command fails."""
        poller = self._poller(cluster_id)
        await poller.wait_since(-1, 20.0)  # after its first poll
        known = [r[field] for r in poller.feed.full().get(kind) or []]
        if value not in known:
            raise tornado.web.HTTPError(404, f"no {what} {value!r} on cluster {cluster_id!r}; "
                                        f"{kind}: {known or 'none'}",
                                        reason=f"unknown {what.split()[0]}")
        try:
            await poller.command(command)
        except CommandError as err:
            raise tornado.web.HTTPError(409, str(err), reason=f"{verb} failed") from err
        return value

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """Always JSON: ``{"message": ..., "reason": ...}`` (APIHandler's, without traceback)."""
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = getattr(exc, "log_message", None) or self._reason
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"message": message, "reason": self._reason}))


class ClustersHandler(_Base):
    @tornado.web.authenticated
    def get(self) -> None:
        self._json({"clusters": [c.public() for c in self.sidebar.clusters()]})

    @tornado.web.authenticated
    async def post(self) -> None:
        body = self.get_json_body() or {}
        name = str(body.get("name") or "raytpu")
        tpu = str(body.get("tpu") or "v4:2x2x2")
        slices = str(int(body.get("slices") or 1))
        await self._cli(["up", "--name", name, "--tpu", tpu, "--slices", slices], 300.0)
        self._json({"clusters": [c.public() for c in self.sidebar.clusters()]})

    @tornado.web.authenticated
    async def delete(self, cluster_id: str) -> None:
        ref = self._ref(cluster_id)
        if ref.kind != "emulated":
            raise tornado.web.HTTPError(400, f"cluster {cluster_id!r} is not emulated here; only "
                                        "emulated clusters can be stopped from the sidebar",
                                        reason="not emulated")
        poller = self.sidebar.pollers.pop(cluster_id, None)
        if poller is not None:
            await poller.close()
        await self._cli(["down", ref.name], 60.0)
        self._json({"clusters": [c.public() for c in self.sidebar.clusters()]})

    def _ref(self, cluster_id: str) -> ClusterRef:
        try:
            return find(cluster_id, self.sidebar.clusters())
        except UnknownClusterError as err:
            raise tornado.web.HTTPError(404, str(err.args[0]), reason="unknown cluster") from err

    async def _cli(self, args: list[str], timeout_s: float) -> None:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "raytpu_lab.cli", *args, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            env=dict(os.environ), start_new_session=True)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
        except asyncio.TimeoutError as err:
            raise tornado.web.HTTPError(504, f"raytpu {args[0]} did not finish in {timeout_s:.0f} s",
                                        reason="timeout") from err
        if proc.returncode:
            text = out.decode(errors="replace").strip()[-2000:]
            raise tornado.web.HTTPError(400, f"raytpu {' '.join(args)} failed: {text}",
                                        reason="command failed")


class SnapshotHandler(_Base):
    @tornado.web.authenticated
    async def get(self, cluster_id: str) -> None:
        poller = self._poller(cluster_id)
        self._json(await poller.wait_since(-1, 20.0))


class UpdatesHandler(_Base):
    @tornado.web.authenticated
    async def get(self, cluster_id: str) -> None:
        poller = self._poller(cluster_id)
        try:
            since = int(self.get_argument("since", "-1"))
            timeout_s = min(_MAX_WAIT_S, max(0.0, float(self.get_argument("timeout", "20"))))
        except ValueError as err:
            raise tornado.web.HTTPError(400, "since must be an integer revision and timeout a "
                                        "number of seconds", reason="bad argument") from err
        self._json(await poller.wait_since(since, timeout_s))


class DetailsHandler(_Base):
    @tornado.web.authenticated
    def get(self, cluster_id: str) -> None:
        poller = self._poller(cluster_id)
        try:
            worker = int(self.get_argument("worker"))
        except ValueError as err:
            raise tornado.web.HTTPError(400, "worker must be an integer", reason="bad argument") from err
        self._json(poller.feed.details(self.get_argument("slice"), worker))


class ReleaseHandler(_Base):
    @tornado.web.authenticated
    async def post(self, cluster_id: str, name: str) -> None:
        name = await self._act_on(cluster_id, "reservations", "name", unquote(name),
                                  {"op": "release", "name": unquote(name)},
                                  what="reservation named", verb="release")
        self._json({"released": name})


class StopHandler(_Base):
    @tornado.web.authenticated
    async def post(self, cluster_id: str, key: str) -> None:
        key = await self._act_on(cluster_id, "runs", "key", unquote(key),
                                 {"op": "stop", "key": unquote(key)}, what="run", verb="stop")
        self._json({"stopping": key})


def setup_handlers(web_app: Any, state: SidebarState) -> None:
    """Register the handlers on a jupyter_server web app (``settings["raytpu_sidebar"]``)."""
    base = url_path_join(web_app.settings["base_url"], "raytpu", "api")
    web_app.settings["raytpu_sidebar"] = state
    web_app.add_handlers(".*$", [
        (url_path_join(base, "clusters"), ClustersHandler),
        (url_path_join(base, "clusters", _ID), ClustersHandler),
        (url_path_join(base, "clusters", _ID, "snapshot"), SnapshotHandler),
        (url_path_join(base, "clusters", _ID, "updates"), UpdatesHandler),
        (url_path_join(base, "clusters", _ID, "details"), DetailsHandler),
        (url_path_join(base, "clusters", _ID, "reservations", r"(?P<name>[^/]+)", "release"),
         ReleaseHandler),
        (url_path_join(base, "clusters", _ID, "runs", r"(?P<key>[^/]+)", "stop"), StopHandler),
    ])
