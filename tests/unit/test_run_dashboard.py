"""The run dashboard fed with synthetic updates (no Ray, no kernel): throttled redraws, capped log
panes, placement and error views, Stop callback errors shown in the widget, static HTML."""

from __future__ import annotations

import time

from raytpu_lab.tpu.topology import SliceShape
from raytpu_lab.train.result import RunResult
from raytpu_lab.train.run import RunUpdate
from raytpu_lab.widgets.run_dashboard import RunDashboard

SHAPE = SliceShape.of("v6e", "4x4")


def _placement(rank: int) -> dict:
    return {"kind": "placement", "rank": rank, "slice": "tpu-v6e-4x4-0", "worker_id": rank,
            "host": f"10.0.0.{rank + 1}", "node_id": f"{rank:02d}" * 28, "chips": ["0", "1", "2", "3"],
            "megascale_slice_id": None, "pid": 100 + rank}


def _records(step: int, t: float) -> list[dict]:
    return [{"report": step, "rank": r, "time_s": t, "step": step, "loss": 1.0 / (step + 1),
             "acc": 0.5} for r in range(4)]


def test_fast_reports_redraw_at_most_twice_a_second() -> None:
    dash = RunDashboard("fast", redraw_interval_s=0.5)
    dash.on_update(RunUpdate(0.1, workers=[_placement(r) for r in range(4)], slices=["tpu-v6e-4x4-0"]))
    start = time.monotonic()
    step = 0
    while time.monotonic() - start < 1.2:  # ~hundreds of report batches in 1.2 s
        dash.on_update(RunUpdate(time.monotonic() - start, records=_records(step, step * 0.01)))
        step += 1
    assert step > 50
    assert 1 <= dash.redraws <= 4, dash.redraws
    assert "rank 3" in {t.name for t in dash.figure.data}
    assert list(dash.key_select.options)[:2] == ["loss", "acc"]
    assert "tpu-v6e-4x4-0" in dash.placement.value and "10.0.0.4" in dash.placement.value


def test_loud_workers_keep_the_page_small() -> None:
    dash = RunDashboard("loud", max_log_lines=200, log_interval_s=0.0)
    dash.on_update(RunUpdate(0.1, workers=[_placement(r) for r in range(16)]))
    for batch in range(30):  # 16 workers x 30 batches x 100 lines
        logs = [(r, "stdout", f"rank {r} batch {batch} line {i} " + "x" * 60)
                for r in range(16) for i in range(100)]
        dash.on_update(RunUpdate(batch, logs=logs))
    assert len(dash.log_panes.children) == 16
    assert all(p.value == "" for p in dash.log_panes.children)  # closed panes are never sent
    assert dash.log_panes.titles[5].startswith("rank 5 10.0.0.6 - 3000 lines, last 200 shown")
    dash.log_panes.selected_index = 5  # the user opens rank 5
    pane = dash.log_panes.children[5].value
    assert pane.count("\n") == 199 and "rank 5 batch 29 line 99" in pane
    assert len(pane) < 200 * 120


def test_worker_error_is_shown_with_rank_host_and_traceback() -> None:
    dash = RunDashboard("boom")
    dash.on_update(RunUpdate(1.0, workers=[_placement(r) for r in range(4)]))
    dash.on_update(RunUpdate(2.0, errors=[{
        "kind": "error", "rank": 2, "host": "10.0.0.3", "node_id": "n", "slice": "tpu-v6e-4x4-0",
        "worker_id": 2, "error": "ValueError: bad batch",
        "traceback": "Traceback (most recent call last):\n  File \"cell\", line 3\nValueError: bad batch"}]))
    assert "rank 2 on host 10.0.0.3" in dash.message.value
    assert "line 3" in dash.message.value
    result = RunResult("boom", SHAPE, 1, error="rank 2 ...", wall_s=3.0)
    dash.on_end(result)
    assert dash.stop_button.disabled
    assert "failed" in dash.text()


def test_an_exception_in_the_stop_callback_is_shown_in_the_widget() -> None:
    def broken_stop() -> bool:
        raise RuntimeError("controller unreachable")

    dash = RunDashboard("stop", on_stop=broken_stop)
    dash.stop_button.click()
    deadline = time.monotonic() + 5
    while "controller unreachable" not in dash.message.value and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "Stop failed" in dash.message.value and "controller unreachable" in dash.message.value

    unattached = RunDashboard("nothing")
    unattached.stop_button.click()
    assert "not attached to a run" in unattached.message.value


def test_static_html_has_chart_placement_summary_and_logs() -> None:
    dash = RunDashboard("static")
    dash.on_update(RunUpdate(0.5, workers=[_placement(r) for r in range(4)], slices=["tpu-v6e-4x4-0"],
                             logs=[(0, "stdout", "hello <b>"), (1, "stderr", "warn")]))
    for step in range(20):
        dash.on_update(RunUpdate(step, records=_records(step, float(step))))
    result = RunResult("static", SHAPE, 1, wall_s=21.0, storage_path="/tmp/ray_results/static",
                       slice_names=["tpu-v6e-4x4-0"])
    result.records = [r for s in range(20) for r in _records(s, float(s))]
    dash.on_end(result)
    html = dash.static_html()
    assert "Plotly.newPlot" in html or "plotly" in html.lower()
    assert "/tmp/ray_results/static" in html and "10.0.0.4" in html
    assert "hello &lt;b&gt;" in html and "<details>" in html
    fig = dash.static_figure()
    assert fig.layout.updatemenus[0].buttons[0].label == "loss"
    visible = [t for t in fig.data if t.visible is not False]
    assert len(visible) == 4 * 3
