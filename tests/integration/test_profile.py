"""Profiling a few steps of a tiny JaxTrainer run on one v6e 4x4 slice, through the magic.

The run recompiles its step function at step 2 (a new batch shape) and rank 1 sleeps in step 2,
so the trace must show a recompilation and a straggler. (The unit tests' fixture
``tests/unit/fixtures/profile_v6e_4x4_window_1_3`` was captured by this test.)
"""

from __future__ import annotations

from pathlib import Path

import IPython
import pytest
from IPython.testing.globalipapp import start_ipython
from IPython.utils.capture import capture_output

from raytpu_lab.lab import Lab
from raytpu_lab.widgets.svg import inline_svg_imgs

from .conftest import live_actors, live_placement_groups, wait_until

pytestmark = pytest.mark.slow

PROFILED_CELL = '''
def profiled(config):
    import time
    import jax, jax.numpy as jnp, numpy as np, ray.train
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh = Mesh(np.array(jax.devices()).reshape(jax.process_count(), -1), ("data", "model"))
    w = jax.device_put(jnp.full((32, 32), 0.1), NamedSharding(mesh, P(None, "model")))

    @jax.jit
    def step(w, x):
        loss, g = jax.value_and_grad(lambda w: jnp.mean((jnp.tanh(x @ w) - 0.5) ** 2))(w)
        return w - 0.5 * g, loss

    rng = np.random.default_rng(jax.process_index())
    for i in range(config["steps"]):
        rows = 8 if i < 2 else 16  # step 2 compiles `step` again, for the new shape
        x = jax.make_array_from_process_local_data(
            NamedSharding(mesh, P("data", None)), rng.normal(size=(rows, 32)).astype(np.float32))
        w, loss = step(w, x)
        loss = float(loss)
        if i == 2 and jax.process_index() == 1:
            time.sleep(0.3)  # the straggler
        ray.train.report({"step": i, "loss": loss})
'''


@pytest.fixture(scope="module")
def ip():
    shell = start_ipython() or IPython.get_ipython()  # one test shell per process
    shell.run_line_magic("load_ext", "raytpu_lab")
    return shell


def _run(ip, line: str):
    with capture_output() as out:
        result = ip.run_cell(f"%%raytpu {line}\n{PROFILED_CELL}", store_history=False)
    return out, result


def _shown(out) -> str:
    """What the cell displayed (rich outputs, as text/plain) after what it printed."""
    return out.stdout + "\n".join(o.data.get("text/plain", "") for o in out.outputs)


def test_profile_window_traces_every_worker(ip, lab: Lab, tmp_path: Path) -> None:
    out, result = _run(ip, f"jax --topology 4x4 --version v6e --name prof --storage {tmp_path} "
                           "--config \"{'steps': 4}\" --profile 1:3")
    assert result.error_in_exec is None, out.stdout + out.stderr
    report = lab.last_profile
    assert report is not None and report.message is None, report and report.message
    ranks = sorted((tmp_path / "prof" / "profile").glob("rank*"))
    assert len(ranks) == 4
    assert all(list(r.glob("plugins/profile/*/*.xplane.pb")) for r in ranks)
    assert sorted({(b.rank, b.step) for b in report.breakdown}) == [(r, s) for r in range(4) for s in (1, 2)]
    assert all(abs(b.compile_s + b.execute_s + b.report_s + b.host_s - b.step_s) < 1e-6
               for b in report.breakdown)
    assert all(b.compile_s > 0 for b in report.breakdown if b.step == 2)  # the recompilation
    # Compiled at step 0, again at step 2 for the new shape (and, on this JAX, at step 1 for the
    # sharding XLA chose for the updated weights: a real recompilation the view reports).
    step_fn = next(c for c in report.compiles if c.fun_name == "jit(step)")
    assert step_fn.recompiles >= 1 and {0, 2} <= set(step_fn.steps)
    assert report.ops and all(o.module.startswith("jit_") for o in report.ops)
    assert report.straggler() is not None and "(rank 1)" in report.straggler()
    shown = _shown(out)
    assert "xprof server --logdir" in shown and "Straggler: tpu-v6e-4x4-" in shown
    html = [o.data["text/html"] for o in out.outputs if "Skew per host" in o.data.get("text/html", "")]
    assert len(html) == 1 and "data-heat" in inline_svg_imgs(html[0]) and "<script" not in html[0]
    assert any("application/vnd.plotly.v1+json" in o.data for o in out.outputs)  # the figure
    assert wait_until(lambda: not live_placement_groups(), 10), live_placement_groups()
    assert wait_until(lambda: not live_actors(), 10), live_actors()


def test_profile_window_beyond_the_run_is_said_at_the_end(ip, lab: Lab, tmp_path: Path) -> None:
    out, result = _run(ip, f"jax --topology 4x4 --version v6e --name late --storage {tmp_path} "
                           "--config \"{'steps': 2}\" --profile 50:60")
    assert result.error_in_exec is None, out.stdout + out.stderr
    assert "profile window 50:60 never reached: the run reported 2 steps" in _shown(out)
    assert wait_until(lambda: not live_placement_groups(), 10), live_placement_groups()


def test_malformed_profile_window_fails_before_launch(ip, lab: Lab) -> None:
    for bad in ("5", "8:5", "a:b", "3:3"):
        out, result = _run(ip, f"jax --topology 4x4 --version v6e --profile {bad}")
        text = out.stdout + out.stderr
        assert result.error_in_exec is not None and "TrainingConfigError" in text, text
        assert "raytpu_lab/" not in text, text
    assert not live_placement_groups()
