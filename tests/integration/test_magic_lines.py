"""What a user sees from the magics on the test session's shared emulated cluster (runs on its v4
2x2x2 slices, two hosts each):
a failing run shown as one error block, ``--background`` returning before any worker starts, and
the property that any line ends in a result or one clear error and leaves nothing behind.

Property: any ``%raytpu`` / ``%%raytpu`` line ends in a result or one clear error, and leaves
nothing behind.

Hypothesis writes lines as a user might: random subcommands, options and values (good and bad),
quoting (including unclosed quotes), junk words, and cell bodies, a few per example, against one
connected shared emulated cluster (tests/conftest.py). Each line must
end in a result or in one error of the project's family (:class:`RaytpuError`, IPython's
``UsageError``, or a deliberate one-block message), never in a traceback of our code; after each
example (and releasing what it reserved, through the magic) no placement group or actor may be
left, and no emulated cluster or node started or stopped. Training cells always carry a defect (the generated set never starts a
long run), so they exercise every refusal that needs no cluster.
"""

from __future__ import annotations

import os
import shlex

import IPython
import pytest
import ray
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from IPython.core.error import UsageError
from IPython.testing.globalipapp import start_ipython
from IPython.utils.capture import capture_output

import raytpu_lab.lab as lab_module
from raytpu_lab.cluster import emulator
from raytpu_lab.errors import RaytpuError
from raytpu_lab.lab import Lab
from raytpu_lab.magics.brief import Brief as _Brief
from raytpu_lab.magics.brief import DebugTraceback

from .conftest import connected_to, live_actors, live_placement_groups, wait_until

OUTCOMES: dict[str, int] = {}  # lines tried by the property, by outcome (error type or "result")
# Examples of 1-3 lines each (Hypothesis favours short lists: ~1.6 lines on average): 400 give
# ~640 lines (at least MIN_LINES asserted below); fewer while iterating
# (RAYTPU_PROPERTY_EXAMPLES), the line count is then checked against the examples.
EXAMPLES = int(os.environ.get("RAYTPU_PROPERTY_EXAMPLES", "400"))
MIN_LINES = 500 if EXAMPLES >= 400 else EXAMPLES


@pytest.fixture(scope="module")
def ip():
    shell = start_ipython() or IPython.get_ipython()  # None if another module started it
    shell.run_line_magic("load_ext", "raytpu_lab")
    return shell


@pytest.fixture(scope="module")
def lab(cluster):
    """A session connected to the shared cluster, as the kernel's Lab, for the whole module."""
    if ray.is_initialized() and not connected_to(cluster):
        ray.shutdown()  # another module's cluster: one driver talks to one cluster at a time
    session = Lab()
    with lab_module.use_session(session):
        session.connect(cluster.address)
        session.cluster = cluster
        try:
            yield session
        finally:
            for res in session.reservations():
                res.release()


# -- what users type -------------------------------------------------------------------------

NAMES = st.sampled_from(["r1", "r2", "hold", "x y", "", "-x", "r1'", "ghost", "a" * 80])
TOPOLOGIES = st.sampled_from(["2x2x2", "2x2x2", "2X2X2", " 2x2x2", "2x2x1", "4x4", "4x5", "2x2",
                              "0x2x2", "2x2x2x2", "abc", "", "2x2x4", "-1x2x2"])
VERSIONS = st.sampled_from(["v4", "v4", "V4", "tpu-v4", "TPU-V4", "v6e", "v5e", "v9", "", "4"])
COUNTS = st.sampled_from(["1", "1", "2", "0", "-1", "1.5", "two", "1e9", "100000"])
SECONDS = st.sampled_from(["1", "0.5", "0", "-1", "nan", "inf", "-inf", "x", "1e-9"])
JUNK = st.sampled_from(["--bogus", "-x", "extra", "--", "-", "--slice", "--debug", "--help",
                        "--await", "—version", "=", "%raytpu"])
BODIES = st.one_of(
    st.sampled_from(["", "\n", "   \n", "x = 1\n", "def f(config):\n    pass\n",
                     "def f():\n    pass\n", "def f(a, b):\n    pass\n",
                     "def f(*, config):\n    pass\n", "def f(config):\n  return (\n",
                     "def f(config):\n    pass\ndef g(config):\n    pass\n",
                     "raise ValueError('raised at the top of the cell')\n",
                     "import a_module_that_is_not_there\n", "f = 3\n", "lambda: 0\n",
                     "async def f(config):\n    pass\n", "print('hello')\n"]),
    st.text(alphabet="abfx =+:1\n#'\"()", max_size=30),
)


def _opt(flag: str, values: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
    return st.one_of(st.just([]), values.map(lambda v: [flag, v]))


def _words(*parts: st.SearchStrategy[list[str]]) -> st.SearchStrategy[list[str]]:
    return st.tuples(*parts).map(lambda ps: [w for p in ps for w in p])


RESERVE = _words(st.just(["reserve"]), TOPOLOGIES.map(lambda t: [t]),
                 _opt("--version", VERSIONS), _opt("--slices", COUNTS), _opt("--name", NAMES),
                 _opt("--timeout", st.sampled_from(["1", "0.5", "0", "-1", "nan", "inf", "x"])),
                 st.sampled_from([[], ["--detached"]]))
LINES = st.one_of(
    RESERVE, RESERVE,
    _words(st.just(["release"]), NAMES.map(lambda n: [n])),
    _words(st.just(["attach"]), NAMES.map(lambda n: [n])),
    st.sampled_from([["status"], ["reservations"], ["reservations", "--all"], ["map", "--pause"],
                     ["map", "--resume"], ["map"], []]),
    _words(st.just(["map"]), _opt("--interval", SECONDS)),
    # up and connect only as refusals: a valid `up` would start a second cluster
    _words(st.just(["up"]), st.sampled_from([["--tpu", "v6e:4x5"], ["--tpu", "v4-2x2x2"],
                                             ["--tpu", "v9:2x2"], ["--tpu", ""],
                                             ["--tpu", "v6e:16x16"], ["--manifest", "/nonexistent.yaml"],
                                             ["--tpu", "v4:2x2x2", "--slices", "9"]]),
           _opt("--slices", st.sampled_from(["0", "-2", "x"]))),
    st.sampled_from([["connect", "http://127.0.0.1:6379"], ["connect", "ray:/x"],
                     ["connect", "--timeout", "0"], ["connect", "--timeout", "x"],
                     ["apply", "/nonexistent.yaml"], ["scale", "g", "--slices", "-1"],
                     ["delete", "--yes"], ["bogus"], ["--bogus"], ["-h"], ["down", "--bogus"]]),
)

# Training cells: always one defect, so the generated set never starts a long run.
DEFECTS = st.sampled_from([
    ["--topology", "4x5", "--version", "v6e"], ["--topology", "2x2x2", "--version", "v9"],
    ["--topology", "2x2x2", "--version", "v4", "--profile", "8:5"],
    ["--topology", "2x2x2", "--version", "v4", "--profile", "x:y"],
    ["--topology", "2x2x2", "--version", "v4", "--slices", "0"],
    ["--topology", "2x2x2", "--version", "v4", "--config", "[1, 2]"],
    ["--topology", "2x2x2", "--version", "v4", "--config", "{'steps': "],
    ["--topology", "2x2x2", "--version", "v4", "--fn", "nope"],
    ["--reservation", "ghost"], ["--topology", "2x2x2"], ["--version", "v4"], ["--help"],
])
BAD_BODIES = st.sampled_from(["def f(a, b):\n    pass\n", "x = 1\n", "def f(config):\n  return (\n",
                              "def f(config):\n    pass\ndef g(config):\n    pass\n",
                              "def f(*, config):\n    pass\n"])
JAX = _words(st.just(["jax"]), DEFECTS, _opt("--name", NAMES), _opt("--out", NAMES),
             st.sampled_from([[], ["--background"]]))
JAX_BAD_BODY = _words(st.just(["jax", "--topology", "2x2x2", "--version", "v4"]),
                      st.sampled_from([[], ["--background"], ["--config", "{'steps': 1}"]]))
TORCH = _words(st.just(["torch"]), st.sampled_from([
    ["--topology", "4x5", "--version", "v6e"], ["--topology", "2x2x2", "--version", "v5p",
                                                 "--chips-per-worker", "3"],
    ["--topology", "2x2x2", "--version", "v5p", "--backend", "nccl"], ["--topology", "2x2x2"],
    ["--topology", "2x2x2", "--version", "v5p", "--slices", "-1"], ["--help"]]))
RUN = _words(st.just(["run"]), st.sampled_from([["--on", "ghost"], ["--on", "nope"], [],
                                                ["--on"], ["--help"], ["--on", "ghost", "--out", "o"]]))

CELLS = st.one_of(
    st.tuples(JAX, BODIES), st.tuples(JAX_BAD_BODY, BAD_BODIES), st.tuples(TORCH, BODIES),
    st.tuples(RUN, BODIES), st.tuples(LINES, BODIES),
)


@st.composite
def commands(draw: st.DrawFn) -> tuple[str, str | None]:
    """One magic as typed: ``(line, None)`` for ``%raytpu line``, ``(line, body)`` for a cell."""
    if draw(st.booleans()):
        words, body = draw(LINES), None
    else:
        words, body = draw(CELLS)
    words = list(words)
    if draw(st.integers(0, 5)) == 0:  # a junk word somewhere
        words.insert(draw(st.integers(0, len(words))), draw(JUNK))
    rendered = [_quote(w, draw(st.integers(0, 39))) for w in words]
    return " ".join(rendered), body


def _quote(word: str, how: int) -> str:
    if how in (0, 1, 2):
        return f'"{word}"'
    if how == 3:
        return f"'{word}"  # unclosed quote
    if how in (4, 5, 6):
        return f"'{word}'"
    return shlex.quote(word) if (not word or any(c in word for c in " '\"")) else word


# -- the property ------------------------------------------------------------------------------


def _emulated_nodes() -> tuple[int, list[str]]:
    """Alive Ray nodes of the connected cluster, and the emulated clusters running."""
    return (sum(n["Alive"] for n in ray.nodes()),
            [c.name for c in emulator.running()])


def _run(ip, line: str, body: str | None) -> tuple[str, BaseException | None]:
    source = f"%raytpu {line}" if body is None else f"%%raytpu {line}\n{body}"
    with capture_output() as out:
        result = ip.run_cell(source, store_history=False)
    return out.stdout + out.stderr, result.error_before_exec or result.error_in_exec


def _check_outcome(line: str, body: str | None, text: str, error: BaseException | None) -> None:
    where = f"%{'%' if body is not None else ''}raytpu {line}\n{body or ''}\n---\n{text}"
    if error is None:
        assert "most recent call last" not in text, where
        return
    if isinstance(error, DebugTraceback) and "--debug" in line:
        return  # --debug asks for the traceback
    assert isinstance(error, RaytpuError | UsageError | _Brief), (type(error), where)
    if isinstance(error, _Brief):  # a deliberate block; an unexpected error says --debug
        assert "--debug for the traceback" not in str(error), where
    assert "most recent call last" not in text and "raytpu_lab/" not in text, where


@settings(max_examples=EXAMPLES, deadline=None, database=None, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(st.lists(commands(), min_size=1, max_size=3))
@pytest.mark.slow
def test_every_magic_line_ends_in_a_result_or_one_clear_error(ip, lab: Lab, nodes: tuple[int, list[str]],
                                                               typed: list[tuple[str, str | None]],
                                                               ) -> None:
    for line, body in typed:
        text, error = _run(ip, line, body)
        _check_outcome(line, body, text, error)
        OUTCOMES[type(error).__name__ if error is not None else "result"] = \
            OUTCOMES.get(type(error).__name__ if error is not None else "result", 0) + 1
    for res in lab.reservations():  # what the example reserved, released as a user would
        text, error = _run(ip, f"release {shlex.quote(res.name)}", None)
        assert error is None, text
    assert wait_until(lambda: not live_placement_groups(), 10), live_placement_groups()
    assert wait_until(lambda: not live_actors(), 10), live_actors()
    assert _emulated_nodes() == nodes
    assert lab.connected and ray.is_initialized()


@pytest.mark.slow  # counts what the (slow) property test above tried
def test_every_magic_line_property_tried_at_least_500_lines() -> None:
    """The property above ran its examples (1-3 lines each); what they ended in."""
    print("\nmagic lines tried, by outcome:", dict(sorted(OUTCOMES.items())))
    assert sum(OUTCOMES.values()) >= MIN_LINES
    assert OUTCOMES.get("result", 0) > EXAMPLES // 10  # not only refusals


@pytest.fixture(scope="module")
def nodes(lab: Lab, cluster) -> tuple[int, list[str]]:
    """The shared cluster's nodes (a head and every host), and it the only emulated cluster."""
    count = _emulated_nodes()
    assert count == (len(cluster.hosts) + 1, [cluster.name]), count
    return count


# -- runs --------------------------------------------------------------------------------------

FAILING = """
def train_loop_per_worker(config):
    import time, ray.train
    rank = ray.train.get_context().get_world_rank()
    for step in range(config["steps"]):
        ray.train.report({"step": step, "loss": 1.0 / (step + 1)})
        if rank == 1 and step == 1:
            print("rank 1 is about to fail")
            raise ValueError("rank 1 cannot go on")
        time.sleep(0.05)
"""

EPOCHS = """
def train_loop_per_worker(config):
    import time, ray.train
    for epoch in range(config["epochs"]):
        time.sleep(0.2)
        ray.train.report({"epoch": epoch, "loss": 1.0 / (epoch + 1)})
"""


def _outputs_text(out) -> str:
    return "\n".join(str(o.data.get("text/html", "")) + str(o.data.get("text/plain", ""))
                     for o in out.outputs)


@pytest.mark.slow
def test_a_failing_rank_is_one_error_block(ip, lab: Lab, nodes: tuple[int, list[str]]) -> None:
    """Rank 1 raises while rank 0 waits in its next report (as in a collective): the run ends
    with the failing rank's traceback once (in the run's view) and a one-line cell error."""
    with capture_output() as out:
        result = ip.run_cell("%%raytpu jax --topology 2x2x2 --version v4 --name fails "
                             "--config \"{'steps': 100000}\"\n" + FAILING, store_history=False)
    text = out.stdout + out.stderr
    error = result.error_in_exec
    assert type(error).__name__ == "TrainingError", text
    assert "Training run 'fails' failed: rank 1 on host" in text, text
    assert "ValueError: rank 1 cannot go on" in text
    assert "Traceback" not in text and "raytpu_lab/" not in text, text  # the block is short
    shown = _outputs_text(out)
    assert shown.count("Traceback (most recent call last)") == 1, shown[-3000:]
    assert "rank 1 cannot go on" in shown
    run = ip.user_ns["last_run"]
    assert run.error is not None and run.error.startswith("rank 1 on host")
    assert not run.stopped
    assert wait_until(lambda: not live_placement_groups(), 10), live_placement_groups()
    assert wait_until(lambda: not live_actors(), 10), live_actors()


@pytest.mark.slow
def test_background_returns_while_the_run_still_waits_for_its_slice(ip, lab: Lab,
                                                                     nodes: tuple[int, list[str]]) -> None:
    """Ray's own slice placement groups hold every v4 2x2x2 slice: a blocking cell would wait
    for one (up to a minute, then fail); --background returns at once, and the run starts when
    the slices free."""
    from ray.util.tpu import slice_placement_group

    v4_slices = len({h.slice_name for h in lab.cluster.hosts if h.spec.startswith("v4:")})
    others = [slice_placement_group("2x2x2", "v4") for _ in range(v4_slices)]
    try:
        ray.get([o.placement_group.ready() for o in others], timeout=60)
        assert wait_until(lambda: not lab.snapshot().idle_slices("v4-16"), 10)
        with capture_output() as out:
            result = ip.run_cell("%%raytpu jax --topology 2x2x2 --version v4 --name bg "
                                 "--background --config \"{'epochs': 5}\"\n" + EPOCHS,
                                 store_history=False)
            run = ip.user_ns["last_run"]
            waiting = not run.done and run.result is None  # submitted, not launched yet
        assert result.error_in_exec is None, out.stdout + out.stderr
        assert "submitted in the background" in out.stdout
        assert waiting
    finally:
        for other in others:
            other.shutdown()
    # Nobody waits: at its end the run swaps its live view for the static chart and tables
    # itself (a saved notebook then holds the finished run, not a "starting" widget).
    assert wait_until(lambda: run.done, 300), "the background run did not end"
    assert wait_until(lambda: run.dashboard.closed, 10), "the ended run kept its live widgets"
    finished = run.wait(timeout_s=300)
    s = finished.summary()
    assert (s["counts"], s["steps"]) == ("reports", 5)
    assert s["steps_per_s"] > 0
    assert wait_until(lambda: not live_placement_groups(), 10), live_placement_groups()
