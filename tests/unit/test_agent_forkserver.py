"""The agent fork server and its shim, without Ray: a plain script stands in for a Ray agent.

What the raylet relies on: the shim's exit code is the agent's, a signal to the shim reaches the
agent, the agent gets the shim's streams, environment, directory and arguments; and without a
server the shim runs the script itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raytpu_lab.cluster import _agent_forkserver

SHIM = Path(_agent_forkserver.__file__).with_name("_agent_shim.py")
AGENT = """import os, sys, time
print("argv", sys.argv[1:], "cwd", os.getcwd(), "env", os.environ.get("AGENT_TEST"), flush=True)
print("line from stdin:", sys.stdin.readline().strip(), flush=True)
if sys.argv[1] == "sleep":
    time.sleep(60)
sys.exit(int(sys.argv[1]) if sys.argv[1].isdigit() else 0)
"""


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[Path]:
    """A fork server with nothing preloaded (no Ray), listening in ``tmp_path``."""
    sock = tmp_path / "agents.sock"
    code = ("from raytpu_lab.cluster import _agent_forkserver as f\n"
            "f.preload = lambda: None\n"
            f"f.serve({str(sock)!r}, {str(tmp_path)!r})\n")
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    deadline = time.monotonic() + 30
    while not sock.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the server did not listen"
        time.sleep(0.05)
    try:
        yield sock
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _shim(tmp_path: Path, sock: Path | None, *args: str) -> subprocess.Popen[str]:
    agent = tmp_path / "agent.py"
    agent.write_text(AGENT)
    env = {**os.environ, "AGENT_TEST": "yes"}
    if sock is not None:
        env["RAYTPU_AGENT_FORKSERVER"] = str(sock)
    cwd = tmp_path / "work"
    cwd.mkdir(exist_ok=True)
    return subprocess.Popen([sys.executable, "-S", str(SHIM), str(agent), *args], env=env,
                            cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def test_the_agent_runs_in_a_forked_child_with_the_shims_streams_and_exit_code(
        server: Path, tmp_path: Path) -> None:
    shim = _shim(tmp_path, server, "7", "--flag=x")
    out, _ = shim.communicate("hello\n", timeout=30)
    assert shim.returncode == 7
    assert f"argv ['7', '--flag=x'] cwd {tmp_path / 'work'} env yes" in out
    assert "line from stdin: hello" in out


def test_a_signal_to_the_shim_reaches_the_agent(server: Path, tmp_path: Path) -> None:
    shim = _shim(tmp_path, server, "sleep")
    assert shim.stdout is not None
    assert shim.stdout.readline().startswith("argv ['sleep']")
    shim.send_signal(signal.SIGTERM)
    assert shim.wait(timeout=30) == -signal.SIGTERM  # the agent died of it, and so did the shim


def test_the_agent_ends_when_its_stdin_closes_as_under_rays_pipe_check(
        server: Path, tmp_path: Path) -> None:
    shim = _shim(tmp_path, server, "0")
    assert shim.stdin is not None
    shim.stdin.close()  # the raylet's end of the pipe: gone
    assert shim.wait(timeout=30) == 0
    assert shim.stdout is not None and "line from stdin: " in shim.stdout.read()


def test_without_a_server_the_shim_runs_the_agent_itself(tmp_path: Path) -> None:
    shim = _shim(tmp_path, tmp_path / "missing.sock", "5")
    out, _ = shim.communicate("x\n", timeout=60)
    assert shim.returncode == 5
    assert "env yes" in out and "line from stdin: x" in out
