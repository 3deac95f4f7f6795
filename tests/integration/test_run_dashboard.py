"""Watched runs on the shared emulated cluster: real Ray Train, one v6e 4x4 slice, few steps.

Records, placement (4 ranks on the 4 hosts of one slice) and per-rank logs reach the dashboard;
Stop from another thread ends a run that never reports and frees its slice within 10 s; a wrong
signature is refused before anything is taken.
"""

from __future__ import annotations

import threading
import time

import pytest
import ray

from raytpu_lab.errors import TrainingConfigError
from raytpu_lab.lab import Lab
from raytpu_lab.widgets.run_dashboard import RunDashboard

from .conftest import live_actors, live_placement_groups, wait_until

pytestmark = pytest.mark.integration


def _assert_nothing_left() -> None:
    assert wait_until(lambda: not live_placement_groups(), 10), live_placement_groups()
    # Ray Train's detached PlacementGroupCleaner exits a few seconds after its controller.
    assert wait_until(lambda: not live_actors(), 20), live_actors()


def chatty(config):
    import sys
    import time

    import ray.train

    rank = ray.train.get_context().get_world_rank()
    print(f"hello from rank {rank}")
    print(f"warning from rank {rank}", file=sys.stderr)
    for step in range(config["steps"]):
        time.sleep(0.05)
        ray.train.report({"step": step, "loss": 1.0 / (step + 1), "rank_metric": rank})


@pytest.mark.slow
def test_records_placement_and_logs_arrive(lab: Lab) -> None:
    dash = RunDashboard("chatty")
    handle = lab.start_jax(chatty, "4x4", "v6e", name="dash-chatty", config={"steps": 6},
                           listener=dash, mute_driver_logs=True)
    dash.on_stop = handle.stop
    result = handle.wait(timeout_s=240)

    placement = result.placement()
    assert [p["rank"] for p in placement] == [0, 1, 2, 3]
    assert len({p["slice"] for p in placement}) == 1
    assert placement[0]["slice"].startswith("tpu-v6e-4x4-")
    assert result.slice_names == [placement[0]["slice"]]
    assert sorted(p["worker_id"] for p in placement) == [0, 1, 2, 3]  # 4 distinct hosts
    assert len({p["node_id"] for p in placement}) == 4
    assert all(p["chips"] == "0,1,2,3" for p in placement)
    assert len(result.to_pandas("placement")) == 4

    assert {r["rank"] for r in result.records} == {0, 1, 2, 3}
    assert result.steps == 6 and result.final_metrics["rank_metric"] == 0
    for rank in range(4):
        lines = [(r["stream"], r["line"]) for r in result.log_records(rank)]
        assert ("stdout", f"hello from rank {rank}") in lines, lines
        assert ("stderr", f"warning from rank {rank}") in lines, lines
        assert ("stderr", f"hello from rank {rank}") not in lines  # Ray Train's print echo
    assert dash.placement.value.count("<tr") == 5
    assert "finished" in dash.text() and dash.stop_button.disabled
    assert "storage" in dash.summary.value and result.storage_path in dash.summary.value
    assert lab.last_run is result

    # Goodput: every part measured from rank 0's timestamps, together the wall time (within 5%).
    goodput = result.goodput()
    assert goodput.measured and set(result.timings) == {0, 1, 2, 3}
    assert abs(sum(goodput.parts.values()) - result.wall_s) <= 0.05 * result.wall_s
    assert goodput.parts["other"] < 0.5 * result.wall_s, goodput.text()
    assert goodput.parts["distributed init"] > 0 and goodput.parts["first step (compile)"] > 0
    assert 0.1 < goodput.parts["steps"] < result.wall_s  # 5 steady steps of >= 50 ms
    assert goodput.parts["report"] > 0 and goodput.parts["checkpointing"] == 0
    assert "goodput" in dash.summary.value and "MFU" in dash.summary.value
    assert "CPU devices (emulated)" in result.mfu(flops_per_step=1e9).text()
    _assert_nothing_left()


def silent_forever():
    import time

    i = 0
    while True:  # never reports
        print(f"still here {i}", flush=True)
        i += 1
        time.sleep(0.2)


@pytest.mark.slow
def test_stop_from_another_thread_frees_the_slice_within_10_s(lab: Lab) -> None:
    dash = RunDashboard("forever")
    handle = lab.start_jax(silent_forever, "4x4", "v6e", name="dash-forever", listener=dash,
                           mute_driver_logs=True)
    dash.on_stop = handle.stop
    try:
        assert wait_until(lambda: len(handle.result.logs.ranks) == 4, 180), handle.result.workers
        assert not handle.result.records  # it never reported, yet its logs are there
        stopper = threading.Thread(target=handle.stop)
        start = time.monotonic()
        stopper.start()
        stopper.join(15)
        took_s = time.monotonic() - start
        assert handle.done and took_s <= 10.0, took_s
    finally:
        handle.stop()
    result = handle.wait()
    assert result.stopped and result.error is None
    assert "stopped" in dash.text()
    assert any("still here" in r["line"] for r in result.log_records(0))
    print(f"stop took {took_s:.2f} s")
    assert not live_placement_groups()  # freed by the time stop() returned
    # The slice reads idle once its hosts report the chips back and the workers are gone: within
    # the 10 s a stop may take in all (one reading right after stop() can still see them).
    assert wait_until(lambda: all(s.idle for s in lab.snapshot().slices
                                  if s.name in result.slice_names), max(1.0, 10.0 - took_s))
    _assert_nothing_left()


def test_wrong_signature_is_refused_before_anything_is_taken(lab: Lab) -> None:
    before = ray.util.placement_group_table()

    def two_args(config, extra):
        pass

    with pytest.raises(TrainingConfigError, match="two_args"):
        lab.start_jax(two_args, "4x4", "v6e", name="dash-bad")
    assert ray.util.placement_group_table() == before
    assert not live_actors()
