"""The %raytpu magics on the emulated cluster: training through the cell magic, and bad input.

Bad input must print one short message (no traceback) and leave no placement group, actor or
emulator process behind.
"""

from __future__ import annotations

import time

import IPython
import psutil
import pytest
from IPython.testing.globalipapp import start_ipython
from IPython.utils.capture import capture_output

from raytpu_lab.cluster import emulator
from raytpu_lab.lab import Lab

from .conftest import live_actors, live_placement_groups

TRAIN_CELL = '''
def train_loop_per_worker(config):
    import jax, jax.numpy as jnp, numpy as np, optax, ray.train
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from sklearn.datasets import load_digits
    x_all, y_all = load_digits(return_X_y=True)
    x_all = (x_all / 16.0).astype(np.float32)
    mesh = Mesh(np.array(jax.devices()).reshape(jax.process_count(), -1), ("data", "model"))
    w = jax.device_put(jnp.zeros((64, 10)), NamedSharding(mesh, P("model", None)))
    def loss_fn(w, x, y):
        return optax.softmax_cross_entropy_with_integer_labels(x @ w, y).mean()
    step = jax.jit(lambda w, x, y: (w - 0.5 * jax.grad(loss_fn)(w, x, y), loss_fn(w, x, y)))
    rng = np.random.default_rng(jax.process_index())
    for i in range(config["steps"]):
        idx = rng.integers(0, len(x_all), 32)
        x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("data", None)), x_all[idx])
        y = jax.make_array_from_process_local_data(NamedSharding(mesh, P("data")), y_all[idx].astype(np.int32))
        w, loss = step(w, x, y)
        if i % 3 == 2:
            ray.train.report({"step": i, "loss": float(loss), "devices": jax.device_count()})
'''


@pytest.fixture(scope="module")
def ip():
    shell = start_ipython() or IPython.get_ipython()  # None if another module started it
    shell.run_line_magic("load_ext", "raytpu_lab")
    return shell


class _Shown:
    """What a cell printed (stdout + stderr together) and whether it failed."""

    def __init__(self, out, result) -> None:
        self.text = out.stdout + out.stderr
        self.stdout = out.stdout
        self.error = result.error_in_exec


def _run(ip, line: str, cell: str | None = None) -> _Shown:
    source = f"%raytpu {line}" if cell is None else f"%%raytpu {line}\n{cell}"
    with capture_output() as out:
        result = ip.run_cell(source, store_history=False)
    return _Shown(out, result)


def _assert_brief(shown: _Shown, *needles: str) -> None:
    """The cell failed with one short block: no local traceback (frames of our own code)."""
    assert shown.error is not None, shown.text
    assert "raytpu_lab/" not in shown.text, shown.text
    for needle in needles:
        assert needle in shown.text, shown.text


@pytest.mark.slow
def test_jax_cell_trains_on_16_devices_of_one_slice(ip, lab: Lab) -> None:
    out = _run(ip, "jax --topology 4x4 --version v6e --name t16 --config \"{'steps': 24}\"", TRAIN_CELL)
    assert out.error is None, out.text
    run = ip.user_ns["last_run"]
    assert run.error is None
    assert run.final_metrics["devices"] == 16
    losses = run.metric("loss")
    assert len(losses) == 8 and losses[-1] < losses[0]
    assert len(run.slice_names) == 1 and run.slice_names[0].startswith("tpu-v6e-4x4-")
    assert {r["rank"] for r in run.records} == {0, 1, 2, 3}
    assert "finished on tpu-v6e-4x4-" in out.stdout
    _assert_nothing_left(lab)


@pytest.mark.slow
def test_worker_error_is_shown_and_the_slice_freed(ip, lab: Lab) -> None:
    cell = "def boom(config):\n    raise ValueError('bad batch shape from the worker')\n"
    source = "%%raytpu jax --topology 4x4 --version v6e --name boom\n" + cell
    with capture_output() as captured:
        result = ip.run_cell(source, store_history=False)
    out = _Shown(captured, result)
    # One block per failure: the cell's error is one line; the traceback is in the run's view.
    _assert_brief(out, "TrainingError: Training run 'boom' failed: rank ",
                  "ValueError: bad batch shape from the worker", "in the run's view above")
    assert "Traceback" not in out.text
    shown = "\n".join(str(o.data.get("text/html", "")) for o in captured.outputs)
    assert "Traceback (most recent call last)" in shown and "in boom" in shown, shown[-2000:]
    _assert_nothing_left(lab)


@pytest.mark.parametrize(("line", "needle"), [
    ("reserve 4x5 --version v6e", "not a valid topology for v6e"),
    ("reserve 4x4 --version v4", "not a valid topology for v4"),
    ("reserve 4x4 --version v9", "Unknown TPU generation 'v9'"),
    ("reserve 4x4 --version v6e --slices 3", "cluster has 2 intact"),
    ("up --tpu v6e:4x5", "not a valid topology"),
    ("release ghost", "No reservation named 'ghost'"),
    ("reserve 4x4 --version v6e --timeout 0", "must be a finite number above 0"),
    ("reserve 4x4 --version v6e --name 'x y'", "is not a reservation name"),
    ("up --tpu v6e:16x16 --slices 4", "too many for this machine"),  # 256 hosts (64 fit)
    ("connect http://127.0.0.1:6379", "scheme is not a Ray address"),
])
def test_bad_input_is_one_clear_message(ip, lab: Lab, line: str, needle: str) -> None:
    out = _run(ip, line)
    _assert_brief(out, needle, "What to do" if "release" not in line else "")
    _assert_nothing_left(lab)


def test_reserve_with_no_free_slice_names_each_slice(ip, lab: Lab) -> None:
    lab.reserve("4x4", "v6e", slices=2, name="hog")
    start = time.monotonic()
    out = _run(ip, "reserve 4x4 --version v6e --timeout 2")
    assert time.monotonic() - start < 15
    _assert_brief(out, "tpu-v6e-4x4-0: held by hog", "tpu-v6e-4x4-1: held by hog", "0 intact idle")
    lab.release("hog")
    _assert_nothing_left(lab)


def test_bad_config_is_refused_before_launch(ip, lab: Lab) -> None:
    start = time.monotonic()
    out = _run(ip, "jax --topology 4x4 --version v6e --config '[1, 2]'", "def f(config):\n    pass\n")
    _assert_brief(out, "TrainingConfigError", "not a dict")
    out = _run(ip, "jax --topology 4x4 --version v6e --config \"{'steps': \"", "def f(config):\n    pass\n")
    _assert_brief(out, "could not be evaluated", "What to do")
    assert time.monotonic() - start < 10
    _assert_nothing_left(lab)


def test_jax_on_slices_this_session_holds_fails_fast(ip, lab: Lab) -> None:
    lab.reserve("4x4", "v6e", slices=2, name="mine")
    start = time.monotonic()
    out = _run(ip, "jax --topology 4x4 --version v6e", "def f(config):\n    pass\n")
    assert time.monotonic() - start < 10
    _assert_brief(out, "your reservation mine", "%raytpu release")
    lab.release("mine")
    _assert_nothing_left(lab)


def test_release_leaves_the_slice_idle_in_the_next_status(ip, lab: Lab) -> None:
    lab.reserve("4x4", "v6e", name="quick")
    held = lab.reservations()[0].slice_names[0]
    out = _run(ip, "release quick")
    assert out.error is None and "Released 'quick'" in out.text
    assert lab.snapshot().slice(held).state == "free"


def test_up_while_running_says_how_to_reach_it(ip, lab: Lab, cluster: emulator.EmulatedCluster) -> None:
    """A running cluster of that name without the slices asked for (one with them is joined)."""
    out = _run(ip, f"up --name {cluster.name} --tpu v6e:8x8 --slices 1")
    _assert_brief(out, "already running at " + cluster.address, "%raytpu connect", "%raytpu down")


def test_connect_to_nothing_fails_within_15_s(ip, lab: Lab) -> None:
    start = time.monotonic()
    out = _run(ip, "connect 127.0.0.1:9 --timeout 3")
    assert time.monotonic() - start < 15
    _assert_brief(out, "Nothing answered at 127.0.0.1:9")
    assert lab.connected, "a failed connect must keep the current connection"


def test_jax_without_a_cluster(ip, lab: Lab) -> None:
    from raytpu_lab.lab import use_session

    with use_session(Lab()):
        out = _run(ip, "jax --topology 4x4 --version v6e", "def f(config):\n    pass\n")
    _assert_brief(out, "no Ray cluster is connected", "%raytpu up")
    assert "FigureWidget" not in out.stdout


def test_down_of_a_cluster_that_does_not_run_says_so_and_does_nothing(ip, lab: Lab) -> None:
    out = _run(ip, "down --name nosuch")
    _assert_brief(out, "No emulated cluster named 'nosuch' is running", "Nothing was stopped")
    assert lab.connected, "a refused down must keep the connection"


def test_help_and_debug(ip, lab: Lab) -> None:
    out = _run(ip, "reserve --help")
    assert out.error is None and "--version" in out.stdout and "--timeout" in out.stdout
    with pytest.raises(Exception, match="not a valid topology"):
        ip.run_line_magic("raytpu", "--debug reserve 4x5 --version v6e")


def test_status_shows_table_and_map(ip, lab: Lab) -> None:
    with capture_output() as out:
        ip.run_line_magic("raytpu", "status")
    bundle = out.outputs[0].data
    assert "tpu-v6e-4x4-0" in bundle["text/plain"]
    assert '<img class="raytpu-svg"' in bundle["text/html"]  # the map, kept when untrusted


def _assert_nothing_left(lab: Lab) -> None:
    # Ray Train tears its own helpers (e.g. DatasetManager) down asynchronously after a run;
    # give them a bounded moment.
    # Ray's state API can miss an actor that is still going away in one answer and list it in the
    # next, so "nothing left" must hold for a second in a row.
    deadline = time.monotonic() + 30
    clean_since: float | None = None
    while time.monotonic() < deadline:
        pgs, actors = live_placement_groups(), live_actors()
        if pgs or actors:
            clean_since = None
        elif clean_since is None:
            clean_since = time.monotonic()
        elif time.monotonic() - clean_since >= 1.0:
            break
        time.sleep(0.5)
    assert not pgs, pgs
    assert not actors, actors
    assert not lab.reservations()
    assert not [p for p in psutil.process_iter(["cmdline"])
                if any("raytpu/raytpu/" in part for part in (p.info["cmdline"] or []))]
