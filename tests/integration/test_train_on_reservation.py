"""``%%raytpu jax --reservation NAME``: the JaxTrainer run lands exactly on the reserved slice.

Ray Train picks its slice itself (no label_selector with use_tpu=True); with two other v4 slices
idle, only fencing their heads makes it pick the reserved one. The reservation holds its slice
again afterwards and nothing else is left.
"""

from __future__ import annotations

import pytest
from IPython import get_ipython
from IPython.testing.globalipapp import start_ipython
from IPython.utils.capture import capture_output

from raytpu_lab.errors import ReservationError
from raytpu_lab.lab import Lab

from .conftest import live_placement_groups, wait_until

pytestmark = pytest.mark.slow

CELL = '''
def train_loop_per_worker(config):
    import jax, jax.numpy as jnp, ray.train
    for step in range(config["steps"]):
        total = jax.pmap(lambda x: jax.lax.psum(x, "i"), axis_name="i")(jnp.ones(jax.local_device_count()))
        ray.train.report({"step": step, "loss": 1.0 / (step + 1), "devices": float(total[0])})
'''


def test_jax_cell_runs_on_the_reserved_slice_and_the_reservation_takes_it_back(lab: Lab) -> None:
    first = lab.reserve("2x2x2", "v4", name="first")
    mine = lab.reserve("2x2x2", "v4", name="mine")
    lab.release("first")  # two v4 slices idle besides ours: Ray Train alone could take either
    assert len(lab.snapshot().idle_slices("v4-16")) == 2
    ip = start_ipython() or get_ipython()
    ip.run_line_magic("load_ext", "raytpu_lab")
    try:
        with capture_output() as out:
            result = ip.run_cell("%%raytpu jax --reservation mine --name onres --config \"{'steps': 3}\"\n"
                                 + CELL, store_history=False)
        assert result.error_in_exec is None, out.stdout + out.stderr
        run = ip.user_ns["last_run"]
        assert run.slice_names == mine.slice_names != first.slice_names
        assert run.final_metrics["devices"] == 8.0

        # The reservation holds its slice again (chips and head), and nothing else is held.
        snap = lab.snapshot()
        (slice_name,) = mine.slice_names
        assert snap.slice(slice_name).owners == ["mine"] and snap.slice(slice_name).head_locked
        assert sorted(pg["name"] for pg in live_placement_groups()) == \
            ["raytpu:mine", f"raytpu:mine:head:{slice_name}"]
        assert wait_until(lambda: len(lab.snapshot().idle_slices("v4-16")) == 2)

        with pytest.raises(ReservationError, match="not 1 x v6e-16"):
            lab.train_jax(lambda config: None, "4x4", "v6e", reservation="mine")
    finally:
        lab.release("mine")
    assert wait_until(lambda: not live_placement_groups())
