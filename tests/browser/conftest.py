"""A private JupyterLab server on 127.0.0.1 for the real-browser tests.

One server per test session (:func:`lab_server`), handed to each module with no session or kernel
and checked afterwards that the module's kernels are gone. Everything the server and its kernels
touch is fresh and private to the session: config, data,
runtime and settings folders, a kernelspec pinned to this venv's Python. The emulator's state root
(``RAYTPU_EMULATOR_ROOT``) is the test session's own (tests/conftest.py), so a notebook's ``%raytpu
up`` joins the session's shared cluster when the test asked for it and never meets a user's. The
server makes no network calls of its own: the news/announcements plugin is disabled, update checks
are off and the extension manager is read-only.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
KERNEL_NAME = "raytpu-browser-venv"
CHROMIUM = "/usr/bin/chromium"  # Debian's (make browser-deps); never a downloaded browser
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
START_TIMEOUT_S = 60.0


@dataclass
class LabServer:
    """A running JupyterLab server."""

    url: str  # http://127.0.0.1:<port>
    token: str
    root_dir: Path  # notebooks go here
    emulator_root: Path  # $RAYTPU_EMULATOR_ROOT of the server and its kernels
    runtime_dir: Path  # kernel connection files (their paths are in each kernel's command line)
    proc: subprocess.Popen
    log_path: Path

    def lab_url(self, notebook: str) -> str:
        return f"{self.url}/lab/tree/{notebook}?reset&token={self.token}"

    def api(self, path: str, method: str = "GET") -> object:
        req = urllib.request.Request(f"{self.url}{path}", method=method,
                                     headers={"Authorization": f"token {self.token}"})
        # 30 s: on a busy 2-core machine a server shutting kernels down answers late
        with urllib.request.urlopen(req, timeout=30) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_private_jupyter_dirs(base: Path) -> dict[str, str]:
    """Kernelspec, lab settings and page config under ``base``; returns the env vars pointing there."""
    kernel_dir = base / "share" / "kernels" / KERNEL_NAME
    kernel_dir.mkdir(parents=True)
    (kernel_dir / "kernel.json").write_text(json.dumps({
        # This venv's interpreter itself, not whatever "python" is on PATH.
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "raytpu_lab venv (browser test)",
        "language": "python",
        "metadata": {"debugger": False},
    }))
    # This checkout's "Ray TPU" sidebar (its committed build) and server extension, found before
    # any installed copy: JUPYTER_PATH and JUPYTER_CONFIG_DIR come first in Jupyter's search.
    labext = base / "share" / "labextensions"
    labext.mkdir(parents=True)
    (labext / "raytpu-sidebar").symlink_to(REPO / "raytpu_lab" / "jupyter" / "labextension")
    config = base / "config"
    (config / "jupyter_server_config.d").mkdir(parents=True)
    (config / "jupyter_server_config.d" / "raytpu_lab.json").write_text(
        (REPO / "jupyter-config" / "server-config" / "raytpu_lab.json").read_text())
    (config / "labconfig").mkdir(parents=True)
    (config / "labconfig" / "page_config.json").write_text(json.dumps({
        # No "get official Jupyter news?" toast and no fetch of the news feed.
        "disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True},
    }))
    settings = base / "lab-settings"
    tracker = settings / "@jupyterlab" / "notebook-extension"
    tracker.mkdir(parents=True)
    # Render every cell (no virtual scrolling), so outputs below the fold stay in the DOM.
    (tracker / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    for sub in ("data", "runtime", "workspaces"):
        (base / sub).mkdir()
    return {
        "JUPYTER_PATH": str(base / "share"),
        "JUPYTER_CONFIG_DIR": str(config),
        "JUPYTER_DATA_DIR": str(base / "data"),
        "JUPYTER_RUNTIME_DIR": str(base / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(settings),
        "JUPYTERLAB_WORKSPACES_DIR": str(base / "workspaces"),
        "JUPYTER_PLATFORM_DIRS": "1",
    }


def processes_mentioning(*needles: str) -> list[psutil.Process]:
    """Live processes whose command line contains any of ``needles`` (never this process)."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if p.pid == os.getpid() or p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(p.info["cmdline"] or [])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if any(n in cmd for n in needles):
            found.append(p)
    return found


def wait_until_gone(needles: tuple[str, ...], timeout_s: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout_s
    left = processes_mentioning(*needles)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = processes_mentioning(*needles)
    return left


def _describe(procs: list[psutil.Process]) -> str:
    out = []
    for p in procs[:10]:
        try:
            out.append(f"{p.pid}: {' '.join(p.cmdline())[:200]}")
        except psutil.Error:
            continue
    return "\n".join(out)


def _stop_emulated_clusters(emulator_root: Path, env: dict[str, str]) -> None:
    """Last resort after a failed test: stop any cluster a notebook started under the session's
    state root (the session's shared cluster, tests/conftest.py, is left to the session)."""
    if not emulator_root.is_dir() or not any(emulator_root.iterdir()):
        return
    code = ("from raytpu_lab.cluster import emulator as e\n"
            "root = e.state_root()\n"
            "for d in root.iterdir():\n"
            "    c = e.find(d.name) if d.is_dir() and d.name != e.DEFAULT_NAME else None\n"
            "    c is not None and c.down()\n")
    subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, timeout=120,
                   capture_output=True, check=False)


def _kill(procs: list[psutil.Process]) -> None:
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=10)


@contextlib.contextmanager
def _serving_jupyterlab() -> Iterator[LabServer]:
    """JupyterLab on 127.0.0.1:<free port> with a random token; stopped and checked gone afterwards."""
    base = Path(tempfile.mkdtemp(prefix="raytpu-lab-"))
    root_dir = base / "notebooks"
    root_dir.mkdir()
    # The session's emulator root (tests/conftest.py): a notebook's `%raytpu up` joins the
    # session's shared cluster when a test asked for it (the `shared_cluster` fixture).
    emulator_root = Path(os.environ["RAYTPU_EMULATOR_ROOT"])
    env = {**os.environ, **_write_private_jupyter_dirs(base), "PYTHONUNBUFFERED": "1"}
    env.pop("JUPYTER_TOKEN", None)
    token = secrets.token_hex(24)
    port = _free_port()
    log_path = base / "jupyterlab.log"
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser",
           "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root_dir}",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           "--LabApp.extension_manager=readonly",
           "--ServerApp.terminals_enabled=False"]
    if os.geteuid() == 0:  # CI containers run as root
        cmd.append("--allow-root")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=root_dir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    server = LabServer(url=f"http://127.0.0.1:{port}", token=token, root_dir=root_dir,
                       emulator_root=emulator_root, runtime_dir=base / "runtime", proc=proc,
                       log_path=log_path)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert proc.poll() is None, (
                f"JupyterLab exited with {proc.returncode} while starting:\n{server.log_tail()}")
            try:
                status = server.api("/api/status")
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"JupyterLab did not answer /api/status within {START_TIMEOUT_S:.0f} s:\n"
                    f"{server.log_tail()}")
            time.sleep(0.3)
        assert isinstance(status, dict) and "started" in status, status
        specs = server.api("/api/kernelspecs")
        assert isinstance(specs, dict) and KERNEL_NAME in specs["kernelspecs"], (
            f"kernelspec {KERNEL_NAME} not visible to the server: {sorted(specs['kernelspecs'])}")
        argv0 = specs["kernelspecs"][KERNEL_NAME]["spec"]["argv"][0]
        assert argv0 == sys.executable, f"kernel would run {argv0}, not this venv's {sys.executable}"
        yield server
    finally:
        needles = (str(base),)  # the server, its kernels and what they started themselves
        if proc.poll() is None:
            try:  # Graceful first: shuts kernels down (their atexit hooks run).
                server.api("/api/shutdown", method="POST")
                proc.wait(timeout=20)
            except (urllib.error.URLError, OSError, subprocess.TimeoutExpired):
                pass
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        try:  # Anything still in the server's process group.
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _stop_emulated_clusters(emulator_root, env)
        leftovers = wait_until_gone(needles, timeout_s=30)
        _kill(leftovers)
        shutil.rmtree(base, ignore_errors=True)
        assert not leftovers, (
            "processes of the JupyterLab server, its kernels or its emulated cluster outlived the "
            f"test (killed now):\n{_describe(leftovers)}")


KERNEL_STOP_TIMEOUT_S = 30.0


def _kernel_needles(server: LabServer) -> tuple[str, ...]:
    """What the command line of each of the server's kernels contains: its connection file."""
    kernels = server.api("/api/kernels")
    assert isinstance(kernels, list), kernels
    return tuple(f"kernel-{k['id']}.json" for k in kernels)


def _clusters_of_notebooks(emulator_root: Path) -> list[str]:
    """Emulated clusters' folders under the session's root other than the shared cluster's
    (tests/conftest.py names it ``"raytpu"``, :data:`raytpu_lab.cluster.emulator.DEFAULT_NAME`)."""
    if not emulator_root.is_dir():
        return []
    return [d.name for d in emulator_root.iterdir() if d.is_dir() and d.name != "raytpu"]


def stop_kernels(server: LabServer) -> None:
    """End every session and kernel of ``server`` (what a module's notebooks started) and check
    that their processes, and what those started, are gone within 30 s (killed and the test
    failed otherwise): the next module meets a server with no session and no kernel, as a fresh
    server would be."""
    needles = _kernel_needles(server)
    sessions = server.api("/api/sessions")
    assert isinstance(sessions, list), sessions
    for s in sessions:
        with contextlib.suppress(urllib.error.HTTPError):  # ended meanwhile
            server.api(f"/api/sessions/{s['id']}", method="DELETE")
    for needle in _kernel_needles(server):  # kernels without a session
        with contextlib.suppress(urllib.error.HTTPError):
            server.api(f"/api/kernels/{needle[len('kernel-'):-len('.json')]}", method="DELETE")
    leftovers = wait_until_gone(needles, timeout_s=KERNEL_STOP_TIMEOUT_S) if needles else []
    _kill(leftovers)
    if _clusters_of_notebooks(server.emulator_root):  # a notebook's own cluster, rare
        _stop_emulated_clusters(server.emulator_root, dict(os.environ))
    assert server.api("/api/sessions") == [] and server.api("/api/kernels") == [], (
        "the server still lists sessions or kernels after they were shut down")
    assert not leftovers, (
        f"kernels of a module outlived their shutdown (killed now):\n{_describe(leftovers)}")


@pytest.fixture(scope="session")
def _session_lab_server() -> Iterator[LabServer]:
    """One JupyterLab server for the whole session (a start costs seconds of both cores, its
    stop up to a minute of waiting): see :func:`lab_server`."""
    with _serving_jupyterlab() as server:
        yield server


@pytest.fixture(scope="module")
def lab_server(_session_lab_server: LabServer) -> Iterator[LabServer]:
    """The session's JupyterLab server, as a fresh one for this module: no session or kernel
    when the module starts, and every kernel the module started shut down and checked gone when
    it ends (:func:`stop_kernels`). The server itself is stopped, and checked gone with
    everything it started, at the end of the session. Notebooks of earlier modules stay in
    :attr:`LabServer.root_dir` (each module names its own)."""
    server = _session_lab_server
    assert server.proc.poll() is None, f"JupyterLab exited:\n{server.log_tail()}"
    if server.api("/api/kernels") or server.api("/api/sessions"):  # an earlier failed teardown
        stop_kernels(server)
    yield server
    stop_kernels(server)


@contextlib.contextmanager
def jupyterlab_page(server: LabServer, cells: list[str], notebook: str, failure_png: Path, *,
                    height: int, on_failure: Any = None) -> Iterator[tuple[Any, list[str]]]:
    """Write ``cells`` as ``notebook`` in the server's folder (venv kernel), open headless Debian
    chromium; yields ``(page, page_errors)``. On failure: a screenshot to ``failure_png`` and
    ``on_failure(page, page_errors)`` (e.g. print the cells' outputs), then the error."""
    from playwright.sync_api import sync_playwright

    assert os.path.exists(CHROMIUM), "make test installs Debian's chromium (make browser-deps)"
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": KERNEL_NAME, "display_name": "raytpu_lab venv",
                                 "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    nbformat.write(nb, server.root_dir / notebook)
    failure_png.parent.mkdir(exist_ok=True)
    page_errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": height})
            page.on("pageerror", lambda e: page_errors.append(str(e)))
            try:
                yield page, page_errors
            except BaseException:
                with contextlib.suppress(Exception):  # the failure itself is what matters
                    page.screenshot(path=str(failure_png), full_page=True)
                if on_failure is not None:
                    on_failure(page, page_errors)
                raise
        finally:
            browser.close()
