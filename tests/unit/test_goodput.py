"""The goodput split (pure): hand-made timestamps give known parts that add up to the wall time."""

from __future__ import annotations

import pytest

from raytpu_lab.tpu.topology import parse_spec
from raytpu_lab.train.goodput import GOODPUT_PARTS, split_goodput
from raytpu_lab.train.result import RunResult, RunUpdate


def test_a_run_splits_into_its_parts() -> None:
    # 2 s waiting, 1 s start-up, 3 s init, 4 s first step, then 3 reports of 0.5 s (the last
    # with a checkpoint) 2 s apart, 1.5 s of teardown: wall 20 s.
    reports = [(10.0, 10.5, False), (12.5, 13.0, False), (15.0, 15.5, True)]
    g = split_goodput(20.0, placed_s=2.0, process_start_s=3.0, fn_start_s=6.0, fn_end_s=16.0,
                      reports=reports)
    assert list(g.parts) == list(GOODPUT_PARTS)
    assert g.parts["waiting for slices"] == 2.0
    assert g.parts["worker start-up"] == 1.0
    assert g.parts["distributed init"] == 3.0
    assert g.parts["first step (compile)"] == 4.0
    assert g.parts["report"] == 1.0 and g.parts["checkpointing"] == 0.5
    assert g.parts["steps"] == pytest.approx(5.5 - 1.5)
    assert g.parts["other"] == pytest.approx(20.0 - 2 - 1 - 3 - 4 - 1 - 0.5 - 4.0)
    assert sum(g.parts.values()) == pytest.approx(20.0)
    assert g.fraction == pytest.approx(4.0 / 20.0)
    assert next(iter(g.badput)) == "other"  # 4.5 s, the largest badput
    assert "goodput 20% of 20.0 s" in g.text()


@pytest.mark.parametrize("placed, process, fn_start, reports", [
    (None, None, 1.0, []),                       # nothing but the function's start
    (5.0, -30.0, 4.0, [(6.0, 7.0, False)]),      # a process Ray started before launch; late poll
    (1.0, 2.0, 3.0, [(90.0, 200.0, False)]),     # a report past the wall time (clock skew)
    (1.0, 2.0, 50.0, []),                        # a function start past the wall time
])
def test_odd_timestamps_never_give_negative_parts_or_more_than_the_wall(placed, process, fn_start,
                                                                         reports) -> None:
    g = split_goodput(10.0, placed_s=placed, process_start_s=process, fn_start_s=fn_start,
                      fn_end_s=None, reports=reports)
    assert all(v >= 0 for v in g.parts.values()), g.parts
    assert sum(g.parts.values()) == pytest.approx(10.0)


def test_without_worker_timestamps_everything_is_other() -> None:
    g = split_goodput(7.0, placed_s=1.0, process_start_s=None, fn_start_s=None, fn_end_s=None)
    assert not g.measured and g.parts["other"] == 7.0 and g.fraction == 0.0


def test_the_run_result_folds_timing_rows_and_puts_goodput_in_its_summary() -> None:
    run = RunResult(name="g", shape=parse_spec("v4:2x2x2"), num_slices=1)
    run.launched_at = 1000.0
    update = RunUpdate(elapsed_s=3.0, placed_s=1.0, timings=[{
        "kind": "timing", "rank": 0, "process_start": 1001.5, "fn_start": 1003.0,
        "fn_end": 1009.0, "reports": [(1005.0, 1005.2, False), (1008.0, 1008.2, False)]}])
    assert not update.empty
    run.absorb(update)
    run.absorb(RunUpdate(elapsed_s=4.0, placed_s=2.5))  # a later sighting does not move it
    run.wall_s = 10.0
    g = run.goodput()
    assert run.placed_s == 1.0
    assert g.parts["waiting for slices"] == 1.0 and g.parts["worker start-up"] == 0.5
    assert g.parts["distributed init"] == 1.5 and g.parts["first step (compile)"] == 2.0
    assert g.parts["steps"] == pytest.approx(3.2 - 0.4)
    assert run.summary()["goodput"]["parts"]["report"] == pytest.approx(0.4)


def test_the_bar_has_one_segment_per_nonzero_part_as_wide_as_its_share() -> None:
    import re

    from raytpu_lab.widgets.goodput_svg import render_goodput_svg

    g = split_goodput(20.0, placed_s=2.0, process_start_s=3.0, fn_start_s=6.0, fn_end_s=16.0,
                      reports=[(10.0, 10.5, False), (15.0, 15.5, True)])
    svg = render_goodput_svg(g, width=400)
    parts = re.findall(r'data-part="([^"]+)" data-seconds="([\d.]+)" x="[\d.]+" y="0" '
                       r'width="([\d.]+)"', svg)
    assert [p for p, _, _ in parts] == [k for k, v in g.parts.items() if v > 0]
    assert sum(float(w) for _, _, w in parts) == pytest.approx(400, abs=0.1)
    steps = next(float(w) for p, _, w in parts if p == "steps")
    assert steps == pytest.approx(400 * g.parts["steps"] / 20.0, abs=0.01)
    assert "<script" not in svg


def test_the_summary_of_the_dashboard_and_its_static_copy_carries_the_bar() -> None:
    import base64
    import re

    from raytpu_lab.widgets.run_view import RunView

    run = RunResult(name="g", shape=parse_spec("v4:2x2x2"), num_slices=1, wall_s=10.0)
    run.launched_at = 1000.0
    run.absorb(RunUpdate(elapsed_s=1.0, placed_s=1.0, timings=[{
        "kind": "timing", "rank": 0, "process_start": 1001.5, "fn_start": 1003.0,
        "fn_end": 1009.0, "reports": [(1005.0, 1005.2, False), (1008.0, 1008.2, False)]}]))
    view = RunView("g")
    view.result, view.ended = run, True
    page = view.summary_html()
    assert "goodput 28% of 10.0 s" in page
    data = re.search(r'alt="goodput[^"]*" src="data:image/svg\+xml;base64,([^"]+)"', page).group(1)
    assert 'data-part="steps"' in base64.b64decode(data).decode()
