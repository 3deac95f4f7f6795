"""One fork server per emulated cluster for its hosts' Ray agents: Ray imported once, agents forked.

Each Ray node runs two Python agents, started by its raylet: the dashboard agent (metrics, logs,
the Jobs API's job agent) and the runtime-env agent. Started as Ray starts them (a fresh
``python`` importing Ray), each holds ~60-100 MB of its own Python objects (Ray's modules,
aiohttp, grpc, opentelemetry) and spends 2-12 s of CPU importing them, which is most of what an
emulated host costs. Forked from one process that imported those modules once, they share those
pages with each other until they write to them: the same agents, the same code path from their
``__main__`` on, but only their own objects cost memory, and they start without the import.

How the raylet's agent command reaches this server: on emulated hosts, the node launcher makes
Ray build the agent commands as ``python -S _agent_shim.py <agent script> <args>``
(:func:`raytpu_lab._ray_private.route_agents`). The shim (a tiny Python without ``site``) sends
its arguments, environment, working directory and standard streams (file descriptors, over a
Unix socket) to this server, which forks a child that becomes the agent: it takes those streams,
that environment and directory, and runs the agent script as ``__main__`` (``runpy``). The shim
stays the raylet's child for the agent's lifetime: it forwards signals to the agent and exits with
the agent's exit code (the raylet fate-shares with it). The raylet's own fate-sharing reaches the
agent through the pipe Ray's pipe-based health check puts on its standard input
(``RAY_enable_pipe_based_agent_to_parent_health_check=1``), which the agent holds itself.

If the server is not there (or refuses), the shim runs the agent the ordinary way (``exec``).

Protocol (Unix stream socket): the shim sends 8 ASCII digits (the body's length) with its three
standard-stream descriptors attached (``SCM_RIGHTS``), then a JSON body ``{"argv": [script,
*args], "env": {...}, "cwd": path}``; the server answers JSON lines ``{"pid": N}`` once forked and
``{"exit": code}`` when the agent ended.

Run as ``python -m raytpu_lab.cluster._agent_forkserver SOCKET FOLDER``; it exits when ``FOLDER``
(the cluster's folder) is gone or on SIGTERM, and its children (the agents) share its process
group, which the emulator's ``down`` signals.
"""

from __future__ import annotations

import gc
import json
import os
import selectors
import signal
import socket
import sys
import time
from typing import Any, NoReturn

from raytpu_lab.cluster._child_exit import run_then_exit

__all__ = ["preload", "serve"]

_HEADER_BYTES = 8


def preload() -> None:
    """Import what the agents import (their modules and every dashboard agent module Ray loads),
    then freeze the heap so the children's garbage collector does not touch (and copy) it."""
    import ray.dashboard.agent  # noqa: F401
    import ray.dashboard.utils as dashboard_utils
    from ray._private.runtime_env.agent import main as _runtime_env_main  # noqa: F401
    from ray._private.runtime_env.agent import runtime_env_agent  # noqa: F401

    # The dashboard agent loads its modules by scanning ray.dashboard.modules (get_all_modules).
    dashboard_utils.get_all_modules(dashboard_utils.DashboardAgentModule)
    gc.collect()
    gc.freeze()


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = conn.recv(n - len(out))
        if not chunk:
            raise ConnectionError("the shim closed the connection")
        out += chunk
    return out


def _read_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    header, fds, _flags, _addr = socket.recv_fds(conn, _HEADER_BYTES, 3)
    if len(header) < _HEADER_BYTES:
        header += _recv_exact(conn, _HEADER_BYTES - len(header))
    body = _recv_exact(conn, int(header.decode()))
    return json.loads(body), list(fds)


def _become_agent(request: dict[str, Any], fds: list[int]) -> NoReturn:
    """In the forked child: take the shim's streams, environment and directory; run the script."""

    def main() -> None:
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a fresh interpreter
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request.get("cwd") or "/")
        # As `python -u`: unbuffered standard streams on the shim's descriptors.
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        import random

        random.seed()  # not the server's sequence in every agent
        argv = list(request["argv"])
        sys.argv = argv
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        import runpy

        runpy.run_path(argv[0], run_name="__main__")

    run_then_exit(main)


def serve(sock_path: str, folder: str) -> None:
    """Serve agent starts on ``sock_path`` until ``folder`` is gone (see the module docstring)."""
    preload()
    if _threads() > 1:  # forking a threaded process is unsafe: let the shims exec instead
        print(f"agent fork server: {_threads()} threads after import; not serving",
              file=sys.stderr, flush=True)
        return
    if os.path.exists(sock_path):
        os.unlink(sock_path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(sock_path + ".tmp")
    server.listen(64)
    os.replace(sock_path + ".tmp", sock_path)  # shims see a socket only once it listens
    stop = False

    def on_term(_sig: int, _frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    sel = selectors.DefaultSelector()
    sel.register(server, selectors.EVENT_READ)
    waiting: dict[int, socket.socket] = {}  # agent pid -> its shim's connection
    next_check = 0.0
    while not stop:
        for _key, _events in sel.select(timeout=0.2):
            conn, _ = server.accept()
            try:
                conn.settimeout(10.0)
                request, fds = _read_request(conn)
            except (OSError, ValueError, ConnectionError):
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                server.close()
                for other in waiting.values():
                    other.close()
                conn.close()
                _become_agent(request, fds)
            for fd in fds:
                os.close(fd)
            try:
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
                waiting[pid] = conn
            except OSError:
                conn.close()
        while True:  # reap every ended agent
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            shim = waiting.pop(pid, None)
            if shim is not None:
                try:
                    code = os.waitstatus_to_exitcode(status)
                    shim.sendall(json.dumps({"exit": code}).encode() + b"\n")
                except OSError:
                    pass
                shim.close()
        if time.monotonic() >= next_check:
            next_check = time.monotonic() + 2.0
            if not os.path.isdir(folder):
                break
    server.close()
    try:
        os.unlink(sock_path)
    except OSError:
        pass


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
