"""What a user reads after a run and after a bad shape: reports counted when there is no ``step``
key (and said so), and the nearest valid topologies rather than the smallest."""

from __future__ import annotations

import pytest

from raytpu_lab.errors import InvalidTopologyError
from raytpu_lab.tpu.topology import SliceShape, nearest_topologies, parse_spec
from raytpu_lab.train.result import RunResult


def _run(key: str, n: int = 100, dt_s: float = 1.1627) -> RunResult:
    rows = [{"report": i, "rank": rank, "time_s": 5.0 + i * dt_s, key: i, "loss": 1.0 / (i + 1)}
            for i in range(n) for rank in range(2)]
    return RunResult(name="r", shape=parse_spec("v4:2x2x2"), num_slices=1, records=rows,
                     wall_s=116.3)


def test_a_run_reporting_epoch_counts_reports_and_says_so() -> None:
    run = _run("epoch")
    assert run.counts == "reports"
    assert run.steps == 100
    assert run.steps_per_s == pytest.approx(1 / 1.1627)
    s = run.summary()
    assert (s["counts"], s["steps"], s["steps_per_s"]) == ("reports", 100, 0.86)
    assert "100 reports in 116.3 s" in repr(run)


def test_a_run_reporting_step_counts_steps() -> None:
    run = _run("step")
    assert run.counts == "steps" and run.steps == 100
    assert run.steps_per_s == pytest.approx(1 / 1.1627)
    assert run.summary()["counts"] == "steps"


def test_one_report_has_no_rate() -> None:
    run = _run("epoch", n=1)
    assert (run.counts, run.steps, run.steps_per_s) == ("reports", 1, 0.0)


@pytest.mark.parametrize(("version", "topology", "nearest"), [
    ("v6e", "4x5", ["4x4", "2x8", "4x8"]),      # 20 chips: 16 is nearer than 32
    ("v6e", "16x17", ["16x16", "8x16", "8x8"]),  # the largest, not the smallest
    ("v4", "2x2x3", ["2x2x4", "2x2x2", "2x4x4"]),
    ("v4", "4x4", ["2x2x4", "2x4x4", "2x2x2"]),  # a 2-D shape on a 3-D generation: by chips
    ("v6e", "abc", ["1x1", "2x2", "2x4"]),       # nothing to compare: the smallest
])
def test_nearest_valid_topologies(version: str, topology: str, nearest: list[str]) -> None:
    assert nearest_topologies(version, topology) == nearest


def test_the_error_carries_the_nearest_shapes_for_any_front_end() -> None:
    with pytest.raises(InvalidTopologyError) as caught:
        SliceShape.of("v6e", "4x5")
    err = caught.value
    assert (err.version, err.topology, err.nearest) == ("v6e", "4x5", ["4x4", "2x8", "4x8"])
    assert "nearest: 4x4, 2x8, 4x8" in err.fix
    assert "1x1" not in err.fix


def test_the_cells_summary_line_says_reports_when_there_is_no_step(capsys) -> None:
    from argparse import Namespace

    from IPython import get_ipython
    from IPython.testing.globalipapp import start_ipython

    from raytpu_lab.magics import RaytpuMagics

    shell = start_ipython() or get_ipython()
    run = _run("epoch")
    run.slice_names = ["tpu-v4-2x2x2-0"]
    RaytpuMagics(shell)._report(Namespace(out="last_run", profile=None), run)
    line = capsys.readouterr().out
    assert "100 reports in 116.3 s (0.86 reports/s)" in line, line
    assert "steps" not in line
    assert shell.user_ns["last_run"] is run
