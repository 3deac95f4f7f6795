"""RunResult summaries, on hand-made report records."""

from __future__ import annotations

from raytpu_lab.tpu.topology import parse_spec
from raytpu_lab.train.result import RunResult


def _records() -> list[dict]:
    rows = []
    for report, (step, loss) in enumerate([(3, 2.0), (7, 1.0), (11, 0.5)]):
        for rank in range(4):
            rows.append({"report": report, "rank": rank, "time_s": 10.0 + 2 * report,
                         "step": step, "loss": loss + rank * 0.01, "step_time_s": 0.05})
    return rows


def test_summary_uses_rank_zero_and_excludes_compile_time() -> None:
    run = RunResult(name="r", shape=parse_spec("v6e:4x4"), num_slices=1, records=_records(),
                    wall_s=30.0, slice_names=["tpu-v6e-4x4-0"])
    assert run.num_workers == 4
    assert run.steps == 12
    assert run.metric("loss") == [2.0, 1.0, 0.5]
    assert run.steps_per_s == (11 - 3) / (14.0 - 10.0)
    assert run.final_metrics["loss"] == 0.5 and "rank" not in run.final_metrics
    summary = run.summary()
    assert summary["slices"] == ["tpu-v6e-4x4-0"] and summary["steps"] == 12
    frame = run.to_pandas()
    assert frame.shape[0] == 12 and set(frame["rank"]) == {0, 1, 2, 3}
    assert "finished" in repr(run)


def test_empty_run_is_safe() -> None:
    run = RunResult(name="e", shape=parse_spec("v4:2x2x2"), num_slices=2)
    assert run.num_workers == 4 and run.steps == 0 and run.steps_per_s == 0.0
    assert run.final_metrics == {}
