"""One JaxTrainer over two v6e 4x4 slices (multi-slice) on the shared emulated cluster.

Ray Train (``ray.train.v2.jax.config._JaxBackend.on_start``) sorts the workers by ``TPU_NAME``
and gives rank ``i`` ``MEGASCALE_SLICE_ID = i // hosts per slice`` together with
``MEGASCALE_NUM_SLICES``, ``MEGASCALE_COORDINATOR_ADDRESS`` (rank 0's IP) and ``MEGASCALE_PORT``
(``ray.util.tpu.get_tpu_coordinator_env_vars``, default 8081). Nothing here sets them.
"""

from __future__ import annotations

import IPython
import pytest
from IPython.testing.globalipapp import start_ipython
from IPython.utils.capture import capture_output

from raytpu_lab.lab import Lab

from .conftest import live_actors, live_placement_groups, wait_until

pytestmark = pytest.mark.slow

ENV_CELL = '''
def report_env(config):
    import os, jax, ray.train
    keys = ("MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID", "MEGASCALE_COORDINATOR_ADDRESS",
            "MEGASCALE_PORT", "TPU_NAME", "TPU_WORKER_ID")
    ray.train.report({"step": 0, **{k: os.environ.get(k) for k in keys},
                      "devices": jax.device_count(), "processes": jax.process_count(),
                      "process_index": jax.process_index()})
'''


@pytest.fixture(scope="module")
def ip():
    shell = start_ipython() or IPython.get_ipython()  # one test shell per process
    shell.run_line_magic("load_ext", "raytpu_lab")
    return shell


def test_slices_2_runs_one_jaxtrainer_over_32_devices(ip, lab: Lab) -> None:
    with capture_output() as out:
        result = ip.run_cell("%%raytpu jax --topology 4x4 --version v6e --slices 2 --name ms2 "
                             "--out ms_run\n" + ENV_CELL, store_history=False)
    assert result.error_in_exec is None, out.stdout + out.stderr
    run = ip.user_ns["ms_run"]
    rows = sorted(run.records, key=lambda r: r["rank"])
    assert [r["rank"] for r in rows] == list(range(8))
    assert {r["devices"] for r in rows} == {32} and {r["processes"] for r in rows} == {8}
    assert [r["process_index"] for r in rows] == list(range(8))
    assert {r["MEGASCALE_NUM_SLICES"] for r in rows} == {"2"}
    assert {r["MEGASCALE_PORT"] for r in rows} == {"8081"}
    coordinators = {r["MEGASCALE_COORDINATOR_ADDRESS"] for r in rows}
    assert len(coordinators) == 1 and coordinators != {None}
    assert [r["MEGASCALE_SLICE_ID"] for r in rows] == ["0"] * 4 + ["1"] * 4
    # Each slice id is one whole slice (all four worker ids), and the two are distinct slices.
    by_id = {sid: {(r["TPU_NAME"], r["TPU_WORKER_ID"]) for r in rows if r["MEGASCALE_SLICE_ID"] == sid}
             for sid in ("0", "1")}
    names = {sid: {n for n, _ in hosts} for sid, hosts in by_id.items()}
    assert all(len(n) == 1 for n in names.values()) and names["0"] != names["1"], by_id
    assert all({w for _, w in hosts} == {"0", "1", "2", "3"} for hosts in by_id.values())
    assert sorted(run.slice_names) == sorted(names["0"] | names["1"])
    assert wait_until(lambda: not live_placement_groups(), 10), live_placement_groups()
    assert wait_until(lambda: not live_actors(), 10), live_actors()
