"""What every tier shares: one private emulator state root per test session and, started once and
only when a test asks for it, one emulated TPU cluster that the integration tests, the notebooks and
the browser tests all use.

Why one cluster: starting an emulated cluster costs a minute or more on this 2-core machine, and
most tests need only a few slices of it. The notebooks keep their own ``%raytpu up --tpu X --slices
N`` cells: :meth:`raytpu_lab.lab.Lab.up` joins a running cluster of the same name that already holds
those slices (as after a kernel restart), and their ``%raytpu down`` then only disconnects. So what
a notebook teaches is unchanged; what it shows may list the shared cluster's other slices too.

Tests that are about starting or stopping clusters (the emulator's own tests, a kernel that exits)
still start their own, under the same private root, which is emptied at the end of the session.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Every slice any shared-cluster test or notebook asks for: two v6e 4x4 slices (the quickstart's
# and the multi-slice runs), three v4 2x2x2 slices of two hosts (reservations and contention), a
# v5p 2x2x2 (PyTorch/XLA, one worker per chip) and one small slice of every other generation Ray
# accepts, so label derivation is checked for each: 18 TPU hosts and a head.
SHARED_SPECS = [("v6e:4x4", 2), ("v4:2x2x2", 3), ("v5litepod:2x2", 1), ("v5p:2x2x2", 1),
                ("v7x:2x2x1", 1)]
SHARED_UP_TIMEOUT_S = 600.0  # generous: a busy machine's slow node starts are retried within it
_ROOT_KEY = pytest.StashKey[tuple]()  # (this session's root, $RAYTPU_EMULATOR_ROOT before it)


def pytest_configure(config: pytest.Config) -> None:
    """A fresh emulator state root for this session, inherited by every kernel, notebook and
    JupyterLab server the tests start: no test meets a user's clusters or another session's."""
    # Short on purpose: Ray's Unix socket paths under it must stay below 107 bytes.
    root = tempfile.mkdtemp(prefix="rtt-", dir="/tmp")
    config.stash[_ROOT_KEY] = (root, os.environ.get("RAYTPU_EMULATOR_ROOT"))
    os.environ["RAYTPU_EMULATOR_ROOT"] = root


_EXIT_STATUS: dict[str, int] = {}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _EXIT_STATUS["status"] = int(exitstatus)


@pytest.hookimpl(trylast=True)  # last: every other plugin has reported and closed its files
def pytest_unconfigure(config: pytest.Config) -> None:
    """Stops what the session left running and removes its state root, then ends the process
    with pytest's own exit status, skipping the interpreter's teardown: CI saw "1192 passed"
    followed by a segmentation fault there (exit 139), in the native threads and destructors of the libraries this process loaded
    (Ray's core worker, gRPC, jaxlib, torch_xla's PJRT client), after every result was written;
    a local run of the same suite exited 0. Nothing of the session is lost: results, durations and
    reruns are printed at session finish, before this hook."""
    _clean_up_the_session(config)
    if "status" in _EXIT_STATUS:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS["status"])


def _clean_up_the_session(config: pytest.Config) -> None:
    root, previous = config.stash.get(_ROOT_KEY, (None, None))
    if root is None:
        return
    from raytpu_lab.cluster import emulator

    for cluster in emulator.running():  # whatever a failed test left, the shared cluster too
        cluster.down()
    shutil.rmtree(root, ignore_errors=True)
    if previous is None:
        os.environ.pop("RAYTPU_EMULATOR_ROOT", None)
    else:
        os.environ["RAYTPU_EMULATOR_ROOT"] = previous


class _SharedStart:
    """The shared cluster's start, begun in a background thread as soon as the collected tests
    show that one of them needs it, so it comes up while the unit tests run."""

    thread: threading.Thread | None = None
    outcome: dict = {}

    @classmethod
    def begin(cls) -> None:
        from raytpu_lab.cluster import emulator

        def start() -> None:
            try:
                cls.outcome["cluster"] = emulator.up(SHARED_SPECS, name=emulator.DEFAULT_NAME,
                                                     timeout_s=SHARED_UP_TIMEOUT_S)
            except BaseException as exc:  # handed to every test that asks for the cluster
                cls.outcome["error"] = exc

        cls.thread = threading.Thread(target=start, name="shared-cluster-up", daemon=True)
        cls.thread.start()

    @classmethod
    def result(cls):
        if cls.thread is None:
            cls.begin()
        assert cls.thread is not None
        cls.thread.join()
        if "error" in cls.outcome:
            raise cls.outcome["error"]
        return cls.outcome["cluster"]


_BUDGET_KEY = pytest.StashKey[float]()  # monotonic deadline of $RAYTPU_TEST_BUDGET_S
_SESSION: dict[str, pytest.Session] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    _SESSION["session"] = session
    budget = os.environ.get("RAYTPU_TEST_BUDGET_S")
    if budget:
        session.config.stash[_BUDGET_KEY] = time.monotonic() + float(budget)


def pytest_runtest_logfinish(nodeid: str, location: tuple) -> None:
    """Past ``$RAYTPU_TEST_BUDGET_S`` seconds (``make test``), stop after the current test, so
    pytest still prints what failed and how long each test took. An outer ``timeout`` sending
    SIGINT is not enough: Ray and Jupyter install handlers of their own that swallow it."""
    session = _SESSION.get("session")
    if session is None:
        return
    deadline = session.config.stash.get(_BUDGET_KEY, None)
    if deadline is not None and time.monotonic() > deadline:
        session.shouldstop = (f"the test budget of {os.environ['RAYTPU_TEST_BUDGET_S']} s is spent"
                              " (RAYTPU_TEST_BUDGET_S); the tests after this one did not run")


@pytest.hookimpl(trylast=True)  # after -k / -m deselection: only the tests that will run count
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    """Start the shared cluster in the background if a selected test needs it, and run the
    tests marked ``clusterless`` (no emulated cluster at all) right after the unit tests, while
    it comes up (a start of its 18 hosts takes minutes here); otherwise the order is kept."""
    if any("shared_cluster" in getattr(item, "fixturenames", ()) for item in items):
        _SharedStart.begin()

    def group(item: pytest.Item) -> int:
        if item.nodeid.startswith("tests/unit/"):
            return 0
        return 1 if item.get_closest_marker("clusterless") else 2

    items.sort(key=group)  # stable: file and test order within each group


@pytest.fixture(scope="session")
def shared_cluster():
    """The session's emulated cluster (:data:`SHARED_SPECS`), named ``"raytpu"`` as a notebook's
    ``%raytpu up`` names its own, so that ``up`` joins it. Started once (in the background from
    the start of the session), stopped at the end.

    Tests leave it as they found it: reservations released, no placement group or actor of theirs
    alive, every host running.
    """
    cluster = _SharedStart.result()
    try:
        yield cluster
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        cluster.down()


def leftovers_on(cluster) -> dict[str, list[str]]:
    """What is still held on ``cluster`` by anyone: live placement groups (by name) and live actors
    (class names, less Ray's process-wide singletons whose names start with ``_``).

    Read through Ray's state API at the cluster's dashboard, so it works whether or not this
    process is connected to the cluster.
    """
    from ray.util.state import list_actors, list_placement_groups

    from raytpu_lab import _ray_private

    _ray_private.enable_token_auth()  # emulated clusters run with Ray token auth, as Lab does
    address = cluster.dashboard_url
    pgs = [pg.name or pg.placement_group_id
           for pg in list_placement_groups(address=address, filters=[("state", "!=", "REMOVED")])]
    actors = [a.class_name for a in list_actors(address=address, filters=[("state", "=", "ALIVE")])
              if not a.class_name.startswith("_")]
    return {"placement_groups": pgs, "actors": actors}


CLEAN = {"placement_groups": [], "actors": []}


def settled_leftovers(cluster, timeout_s: float = 15.0) -> dict[str, list[str]]:
    """:func:`leftovers_on` once it is clean, or after ``timeout_s`` seconds: Ray removes a finished
    run's placement groups and actors asynchronously, and a stopped kernel's a moment later."""
    deadline = time.monotonic() + timeout_s
    while (left := leftovers_on(cluster)) != CLEAN and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def run_notebook(path: Path, out: Path, cluster, *, timeout_s: float = 900.0,
                 env: dict[str, str] | None = None) -> dict:
    """Execute ``path`` headless as ``make demo`` does (``python -m tools.demo --notebook``),
    its ``%raytpu up`` joining ``cluster``.

    Returns:
        ``{"result": the RESULT dict, "out": folder with the executed .ipynb and .html,
        "log": the runner's output}``.

    Fails the test when the notebook fails, when it started a cluster of its own instead of
    joining ``cluster``, or when it left reservations, placement groups or actors on it.
    """
    from raytpu_lab.cluster import emulator

    proc = subprocess.run([sys.executable, "-m", "tools.demo", "--notebook", str(path),
                           "--out", str(out)], cwd=REPO, env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=timeout_s)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT "), log[-4000:]
    now = emulator.find(cluster.name)
    assert now is not None and now.head_pid == cluster.head_pid, (
        f"{path.name} stopped or replaced the shared cluster:\n{log[-2000:]}")
    assert [c.name for c in emulator.running()] == [cluster.name], (
        f"{path.name} started a cluster of its own: {[c.name for c in emulator.running()]}")
    assert (left := settled_leftovers(cluster)) == CLEAN, f"{path.name} left on the cluster: {left}"
    check_saved_outputs(out)
    return {"result": json.loads(last[len("RESULT "):]), "out": out, "log": log}


PLOTLY_MIME = "application/vnd.plotly.v1+json"


def check_saved_outputs(out: Path) -> None:
    """What every executed tutorial saves (the ``.ipynb`` in ``out``): no plotly.js and no script
    in any output, no cell's outputs over 200 KB (a finished run adds kilobytes), and every chart
    (plotly's mime type) carries an SVG image too, which nbconvert, GitHub and VS Code show."""
    saved = sorted(out.glob("*.ipynb"))
    assert saved, f"no executed notebook in {out}"
    for path in saved:
        nb = json.loads(path.read_text())
        for i, cell in enumerate(nb["cells"]):
            outputs = cell.get("outputs", [])
            raw = json.dumps(outputs)
            assert "plotly.min.js" not in raw and "Plotly.newPlot" not in raw, (path.name, i)
            assert "<script" not in raw, (path.name, i)
            assert len(raw) < 200_000, (path.name, i, len(raw))
            for o in outputs:
                data = o.get("data", {})
                if PLOTLY_MIME in data:
                    svg = data.get("image/svg+xml", "")
                    svg = "".join(svg) if isinstance(svg, list) else svg  # nbformat's line lists
                    assert svg.startswith("<svg"), (path.name, i)


@pytest.fixture(scope="session")
def quickstart_build(tmp_path_factory: pytest.TempPathFactory, shared_cluster) -> Iterator[dict]:
    """Run the quickstart notebook headless once, as `make demo` does, on the shared cluster.

    Returns ``{"out": folder with quickstart.ipynb/.html, "result": the RESULT dict, "log": text}``.
    """
    out = tmp_path_factory.mktemp("quickstart")
    yield run_notebook(REPO / "notebooks" / "01_quickstart.ipynb", out, shared_cluster)
