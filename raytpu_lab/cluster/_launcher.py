"""One launcher process per emulated-cluster start: Ray's CLI imported once, ``ray start`` forked
per node.

``ray start`` spends most of its time importing Ray (2 s on a quiet 2-core machine, 12 s on a busy
one); starting 64 hosts that way costs minutes of CPU before a single raylet runs. The launcher
imports Ray's CLI once, then for each node forks a child that becomes a new session (the node's
process group), takes the node's environment and log file, and runs ``ray start`` in-process
(:func:`raytpu_lab._ray_private.ray_cli_main`): the same code path, arguments, output and exit
code as the command, without the import. Ray starts no thread on import, so forking is safe.

Protocol (JSON lines): the parent writes ``{"id": .., "env": {..}, "argv": [..], "log": path,
"nice": n}``
to the launcher's stdin; the launcher answers ``{"id": .., "pid": ..}`` when it forked and
``{"id": .., "exit": code}`` when that ``ray start`` ended. EOF on stdin: the launcher waits for
its children, then exits. The node daemons outlive both (as after ``ray start``).
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

from raytpu_lab.cluster._child_exit import run_then_exit

__all__ = ["Launcher"]



class Launcher:
    """The parent's handle on a launcher process (see the module docstring)."""

    def __init__(self, env: dict[str, str]) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "raytpu_lab.cluster._launcher"], env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, bufsize=1, start_new_session=True)
        self._pids: dict[int, int] = {}
        self._exits: dict[int, int] = {}
        self._cond = threading.Condition()
        self._next = 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            with self._cond:
                if "pid" in msg:
                    self._pids[msg["id"]] = msg["pid"]
                if "exit" in msg:
                    self._exits[msg["id"]] = msg["exit"]
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def start(self, env: dict[str, str], argv: list[str], log: Path, timeout_s: float = 120.0,
              nice: int = 0) -> int:
        """Fork ``ray <argv>`` with ``env``, output appended to ``log``; returns the launch id.

        ``nice`` (negative: more CPU) is the CPU priority of the node's processes, where this
        process may raise it (root); 0 leaves it as it is.

        Raises:
            RuntimeError: The launcher died or did not fork within ``timeout_s`` seconds.
        """
        launch_id = self._next
        self._next += 1
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps({"id": launch_id, "env": env, "argv": argv,
                                               "log": str(log), "nice": nice}) + "\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError) as err:
            raise RuntimeError("the emulator's node launcher exited") from err
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while launch_id not in self._pids:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the emulator's node launcher did not start a node")
                self._cond.wait(0.2)
        return launch_id

    def pid(self, launch_id: int) -> int:
        """The forked ``ray start``'s pid, which is also its node's process-group id."""
        with self._cond:
            return self._pids[launch_id]

    def poll(self, launch_id: int) -> int | None:
        """That ``ray start``'s exit code, or ``None`` while it runs (1 if the launcher died)."""
        with self._cond:
            if launch_id in self._exits:
                return self._exits[launch_id]
        if self._proc.poll() is not None:
            return 1
        return None

    def close(self) -> None:
        """End the launcher (its children, if any still run, are left to finish or be killed)."""
        if self._proc.stdin is not None:
            try:
                self._proc.stdin.close()
            except OSError:
                pass
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def _raise_priority(nice: int) -> None:
    """Give this new session (the node's raylet and agents inherit it) CPU priority ``nice``
    (negative: more CPU), best effort: without the privilege to raise it, nothing changes.

    Linux with autogroup scheduling shares CPU between sessions first, so both the session's
    autogroup and the process get it."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError:
        return
    try:
        with open("/proc/self/autogroup", "w") as group:
            group.write(str(nice))
    except OSError:
        pass


def _child(msg: dict[str, Any]) -> NoReturn:
    """In the forked child: become the node's session, take its environment and log, run the CLI."""

    def main() -> int | None:
        os.setsid()
        if msg.get("nice"):
            _raise_priority(int(msg["nice"]))
        fd = os.open(msg["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.environ.clear()
        os.environ.update(msg["env"])
        from raytpu_lab import _ray_private

        _ray_private.fresh_node_id()  # forked children share the parent's C++ random state

        if os.environ.get("RAYTPU_AGENT_FORKSERVER"):  # a host: its agents come from the server
            shim = str(Path(__file__).with_name("_agent_shim.py"))
            _ray_private.route_agents([sys.executable, "-S", shim])
        return _ray_private.ray_cli_main(msg["argv"])

    run_then_exit(main)


def _main() -> None:
    from raytpu_lab import _ray_private

    _ray_private.ray_cli_main(None)  # import Ray's CLI once, before any fork
    children: dict[int, int] = {}  # pid -> launch id
    sel = selectors.DefaultSelector()
    sel.register(sys.stdin, selectors.EVENT_READ)
    open_input = True

    def say(msg: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(msg) + "\n")
        sys.stdout.flush()

    while open_input or children:
        if open_input and sel.select(timeout=0.05):
            line = sys.stdin.readline()
            if not line:
                open_input = False
                sel.unregister(sys.stdin)
            else:
                msg = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _child(msg)
                children[pid] = msg["id"]
                say({"id": msg["id"], "pid": pid})
        elif not open_input:
            time.sleep(0.05)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            launch_id = children.pop(pid, None)
            if launch_id is not None:
                say({"id": launch_id, "exit": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    _main()
