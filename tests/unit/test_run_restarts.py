"""A run's restart budget (max_failures) and its attempts, on hand-made rows: the checks of the
spec, the option of a cell, and what the result, the dashboard and its static copy say."""

from __future__ import annotations

import pytest

from raytpu_lab.errors import TrainingConfigError
from raytpu_lab.magics.parser import build_parser
from raytpu_lab.tpu.topology import parse_spec
from raytpu_lab.train.result import RunResult, RunUpdate
from raytpu_lab.train.spec import RunSpec, max_failures_of, validate
from raytpu_lab.widgets.run_view import RunView


@pytest.mark.parametrize("value", [-2, 1.5, "1", True, None])
def test_a_bad_budget_is_refused_before_anything(value: object) -> None:
    with pytest.raises(TrainingConfigError, match="max failures is"):
        validate(RunSpec("jax", "2x2x1", "v4", max_failures=value))  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [-1, 0, 3])
def test_good_budgets_pass(value: int) -> None:
    assert validate(RunSpec("jax", "2x2x1", "v4", max_failures=value)).spec.max_failures == value


class _FailureConfig:  # as ray.train.FailureConfig: read by attribute
    def __init__(self, max_failures: int) -> None:
        self.max_failures = max_failures


def test_failure_config_or_max_failures() -> None:
    assert max_failures_of(2) == 2 and max_failures_of(0, _FailureConfig(3)) == 3
    assert max_failures_of(3, _FailureConfig(3)) == 3
    with pytest.raises(TrainingConfigError, match="differ"):
        max_failures_of(1, _FailureConfig(3))
    with pytest.raises(TrainingConfigError, match="no max_failures"):
        max_failures_of(0, object())


def test_a_cell_takes_max_failures() -> None:
    args = build_parser().parse_args(["jax", "--topology", "2x2x1", "--version", "v4",
                                      "--max-failures", "2"])
    assert args.max_failures == 2
    assert build_parser().parse_args(["torch"]).max_failures == 0


def _placement(rank: int, slice_name: str, host: str, slice_id: str, coordinator: str,
               attempt: int) -> dict:
    row = {"kind": "placement", "rank": rank, "local_rank": 0, "world_size": 2, "node_id": "n",
           "host": host, "hostname": "h", "pid": 1, "slice": slice_name, "worker_id": 0,
           "chips": ["0", "1", "2", "3"], "megascale_coordinator_address": coordinator,
           "megascale_num_slices": "2", "megascale_slice_id": slice_id}
    if attempt:
        row["attempt"] = attempt
    return row


def _restarted_run() -> RunResult:
    run = RunResult(name="r", shape=parse_spec("v4:2x2x1"), num_slices=2)
    run.absorb(RunUpdate(elapsed_s=1.0, workers=[
        _placement(0, "s-0", "127.0.0.2", "0", "127.0.0.2", 0),
        _placement(1, "s-1", "127.0.0.3", "1", "127.0.0.2", 0)],
        records=[{"report": 0, "rank": r, "time_s": 2.0, "step": 0} for r in (0, 1)]))
    run.absorb(RunUpdate(elapsed_s=6.0, restarts=[{
        "at_s": 5.0, "state": "RESTARTING", "errors": {1: "ActorDiedError: the node died"},
        "error": "Training failed due to worker errors"}], workers=[
        _placement(0, "s-0", "127.0.0.2", "0", "127.0.0.2", 1),
        _placement(1, "s-2", "127.0.0.4", "1", "127.0.0.2", 1)]))
    run.absorb(RunUpdate(elapsed_s=9.0, records=[
        {"report": 1, "rank": r, "time_s": 8.5, "step": 0, "attempt": 1} for r in (0, 1)]))
    run.wall_s = 12.0
    return run


def test_attempts_say_where_each_ran_what_failed_and_the_time_lost() -> None:
    first, second = _restarted_run().attempts()
    assert first["outcome"] == "restarted" and second["outcome"] == "finished"
    assert first["slices"] == ["s-0", "s-1"] and second["slices"] == ["s-0", "s-2"]
    assert first["failed_ranks"] == [1] and first["failed_slices"] == ["s-1"]
    assert first["failed_hosts"] == ["127.0.0.3"]
    assert "rank 1 on host 127.0.0.3 (s-1 worker 0) failed: ActorDiedError" in first["cause"]
    assert first["lost_s"] == 8.5 and second["lost_s"] is None
    assert (first["ended_s"], second["started_s"], second["ended_s"]) == (5.0, 5.0, 12.0)
    assert [m["slice_id"] for m in second["megascale"]] == ["0", "1"]
    assert {m["coordinator"] for m in second["megascale"]} == {"127.0.0.2"}


def test_an_unrestarted_run_has_one_attempt() -> None:
    run = RunResult(name="r", shape=parse_spec("v4:2x2x1"), num_slices=1)
    (only,) = run.attempts()
    assert only["outcome"] == "running" and only["cause"] == "" and only["lost_s"] is None
    assert RunView("r").restarts_html() == ""


def test_the_view_lists_the_restart_and_keeps_metrics_clean() -> None:
    run = _restarted_run()
    view = RunView("r")
    view.result, view.state, view.ended = run, "finished", True
    assert "attempt 2, 1 restart" in view.text() and "2 workers" in view.text()
    html = view.restarts_html()
    assert "Restarts" in html and "s-1" in html and "restarted" in html and "8.5" in html
    assert view.restart_text().startswith("attempt 0 -> 1 at 5.0 s: rank 1 on host 127.0.0.3")
    assert "Restarts" in view.static_html(chart=False)
    assert "attempt" not in run.final_metrics and run.summary()["restarts"] == 1


def test_the_controller_callback_reports_restarts_only() -> None:
    """On Ray Train's own state objects (no cluster): a restart is sent, other states are not."""
    from ray.train import WorkerGroupError
    from ray.train.v2._internal.execution.controller.state import RestartingState, RunningState

    from raytpu_lab import _ray_private

    sent: list[dict] = []
    callback = _ray_private.restart_reporter(sent.append)
    failed = WorkerGroupError("rank 1 died", {1: RuntimeError("node lost")})
    callback.after_controller_state_update(RunningState(), RestartingState(failed))
    callback.after_controller_state_update(RestartingState(failed), RunningState())
    (event,) = sent
    assert event["kind"] == "restart" and event["state"] == "RESTARTING"
    assert event["errors"] == {1: "RuntimeError: node lost"} and "rank 1 died" in event["error"]
