"""One poll per cluster, however many browser tabs watch it.

A :class:`ClusterPoller` owns one :class:`Source` (normally :class:`SubprocessSource`, the
:mod:`~raytpu_lab.jupyter.poll_worker` process) and one :class:`~raytpu_lab.jupyter.feed.ClusterFeed`.
Clients long-poll :meth:`ClusterPoller.wait_since`: each waits on the same condition, woken once
per revision; no client ever causes a poll of its own. The source starts on the first client and
stops after :attr:`idle_stop_s` seconds without one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

from raytpu_lab.jupyter.feed import ClusterFeed

__all__ = ["ClusterPoller", "Source", "SubprocessSource", "CommandError"]


class CommandError(RuntimeError):
    """The poller process refused or failed a command (its message says why)."""


class Source(Protocol):
    """Where a poller's messages come from (one ``state``/``error`` message per poll)."""

    async def next(self) -> dict[str, Any]:
        """The next message; raises ``EOFError`` when the source ended."""

    async def command(self, cmd: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send ``cmd``; return the reply."""

    async def close(self) -> None:
        """Stop (idempotent)."""


class SubprocessSource:
    """The :mod:`~raytpu_lab.jupyter.poll_worker` process for one Ray address.

    Args:
        target: Ray address or ``"kuberay:NS/NAME"``.
        interval_s: Seconds between polls.
    """

    def __init__(self, target: str, interval_s: float) -> None:
        self.target = target
        self.interval_s = interval_s
        self._proc: asyncio.subprocess.Process | None = None
        self._ids = itertools.count(1)
        self._replies: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._reader: asyncio.Task[None] | None = None

    async def _start(self) -> asyncio.subprocess.Process:
        if self._proc is None:
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "raytpu_lab.jupyter.poll_worker", self.target,
                str(self.interval_s), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=env,
                limit=64 * 1024 * 1024)
            self._reader = asyncio.ensure_future(self._read())
        return self._proc

    async def _read(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        while True:
            line = await proc.stdout.readline()
            if not line:
                break
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg.get("type") == "reply":
                fut = self._replies.pop(int(msg.get("id") or 0), None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
            else:
                await self._queue.put(msg)
        await self._queue.put(None)

    async def next(self) -> dict[str, Any]:
        """The next ``state``/``error`` message of the process (starting it first)."""
        await self._start()
        msg = await self._queue.get()
        if msg is None:
            raise EOFError("the poller process ended")
        return msg

    async def command(self, cmd: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send ``cmd`` (``op`` and its fields) and wait for the reply."""
        proc = await self._start()
        assert proc.stdin is not None
        cid = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._replies[cid] = fut
        proc.stdin.write((json.dumps({**cmd, "id": cid}) + "\n").encode())
        await proc.stdin.drain()
        try:
            return await asyncio.wait_for(fut, timeout_s)
        finally:
            self._replies.pop(cid, None)

    async def close(self) -> None:
        """End the process: close its stdin (it exits), kill it after 3 s."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 3.0)
        except asyncio.TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        if self._reader is not None:
            self._reader.cancel()


class ClusterPoller:
    """The one poll of one cluster, shared by every client (see the module docstring).

    Args:
        make_source: Builds the source when the first client comes (again after an idle stop).
        feed: The cluster's feed.
        idle_stop_s: Stop polling after this many seconds without a client request.
    """

    def __init__(self, make_source: Callable[[], Source], feed: ClusterFeed, *,
                 idle_stop_s: float = 120.0) -> None:
        self.make_source = make_source
        self.feed = feed
        self.idle_stop_s = idle_stop_s
        self.source: Source | None = None
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Condition()
        self._last_client = time.monotonic()
        self.first_poll = asyncio.Event()

    def ensure_running(self) -> None:
        """Start polling if not running (every client request calls this)."""
        self._last_client = time.monotonic()
        if self._task is None or self._task.done():
            self.source = self.make_source()
            self._task = asyncio.ensure_future(self._run(self.source))

    async def _run(self, source: Source) -> None:
        try:
            while time.monotonic() - self._last_client < self.idle_stop_s:
                try:
                    msg = await source.next()
                except EOFError:
                    self.feed.fail("the poller process ended; it restarts on the next request")
                    break
                if msg.get("type") == "state":
                    self.feed.apply(msg.get("raw") or {}, msg.get("lifetimes") or {},
                                    msg.get("runs") or [])
                else:
                    self.feed.fail(str(msg.get("error", "poll failed")))
                self.first_poll.set()
                async with self._changed:
                    self._changed.notify_all()
                if msg.get("fatal"):
                    break
        finally:
            self.first_poll.set()
            async with self._changed:
                self._changed.notify_all()
            await source.close()

    async def wait_since(self, rev: int, timeout_s: float) -> dict[str, Any]:
        """What a client at ``rev`` needs, waiting up to ``timeout_s`` for a change if it is
        current (:meth:`ClusterFeed.since`)."""
        self.ensure_running()
        if not self.first_poll.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.first_poll.wait(), timeout_s)
        if rev == self.feed.rev and timeout_s > 0:
            async with self._changed:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(
                        self._changed.wait_for(lambda: self.feed.rev != rev), timeout_s)
        return self.feed.since(rev)

    async def command(self, cmd: dict[str, Any], timeout_s: float = 20.0) -> dict[str, Any]:
        """Run ``cmd`` in the poller process.

        Raises:
            CommandError: The process answered ``ok: false`` (its ``error`` is the message).
        """
        self.ensure_running()
        assert self.source is not None
        reply = await self.source.command(cmd, timeout_s)
        if not reply.get("ok"):
            raise CommandError(str(reply.get("error") or "failed"))
        return reply

    async def close(self) -> None:
        """Stop polling now."""
        if self.source is not None:
            await self.source.close()
        if self._task is not None:
            self._task.cancel()
