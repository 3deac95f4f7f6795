"""The run dashboard fed with synthetic updates (no Ray, no kernel): throttled redraws, capped log
panes, placement and error views, Stop callback errors shown in the widget, the live chart's
wire protocol and traffic, the static bundles a finished run leaves, and collectability.

Each update is folded into the run's one :class:`RunResult` first (``_feed``), as a run's drain
thread does; the dashboard draws from that result."""

from __future__ import annotations

import time
import weakref
from typing import Any

from raytpu_lab.tpu.topology import SliceShape
from raytpu_lab.train.result import RunResult
from raytpu_lab.train.run import RunUpdate
from raytpu_lab.widgets.run_dashboard import RunDashboard

SHAPE = SliceShape.of("v6e", "4x4")
_RESULTS: weakref.WeakKeyDictionary[RunDashboard, RunResult] = weakref.WeakKeyDictionary()


def _result(dash: RunDashboard) -> RunResult:
    if dash not in _RESULTS:
        _RESULTS[dash] = RunResult(dash.title, SHAPE, 1)
    return _RESULTS[dash]


def _feed(dash: RunDashboard, update: RunUpdate) -> None:
    """What a run's drain thread does: fold the update into the result, hand it over."""
    dash.on_update(_result(dash).absorb(update))


def _end(dash: RunDashboard, **fields: Any) -> RunResult:
    """The run ends with ``fields`` (error, wall_s...) set on its result."""
    result = _result(dash)
    for key, value in fields.items():
        setattr(result, key, value)
    dash.on_end(result)
    return result


def _placement(rank: int) -> dict:
    return {"kind": "placement", "rank": rank, "slice": "tpu-v6e-4x4-0", "worker_id": rank,
            "host": f"10.0.0.{rank + 1}", "node_id": f"{rank:02d}" * 28, "chips": ["0", "1", "2", "3"],
            "megascale_slice_id": None, "pid": 100 + rank}


def _records(step: int, t: float) -> list[dict]:
    return [{"report": step, "rank": r, "time_s": t, "step": step, "loss": 1.0 / (step + 1),
             "acc": 0.5} for r in range(4)]


def test_fast_reports_redraw_at_most_twice_a_second() -> None:
    dash = RunDashboard("fast", redraw_interval_s=0.5)
    _feed(dash, RunUpdate(0.1, workers=[_placement(r) for r in range(4)], slices=["tpu-v6e-4x4-0"]))
    start = time.monotonic()
    step = 0
    while time.monotonic() - start < 1.2:  # ~hundreds of report batches in 1.2 s
        _feed(dash, RunUpdate(time.monotonic() - start, records=_records(step, step * 0.01)))
        step += 1
    assert step > 50
    assert 1 <= dash.redraws <= 4, dash.redraws
    assert dash.chart.sent_messages <= 4  # new points reach the browser at most twice a second
    assert list(dash.chart.metrics)[:2] == ["loss", "acc"] and dash.chart.key == "loss"
    assert "tpu-v6e-4x4-0" in dash.placement.value and "10.0.0.4" in dash.placement.value


def test_loud_workers_keep_the_page_small() -> None:
    dash = RunDashboard("loud", max_log_lines=200, log_interval_s=0.0)
    _feed(dash, RunUpdate(0.1, workers=[_placement(r) for r in range(16)]))
    for batch in range(30):  # 16 workers x 30 batches x 100 lines
        logs = [(r, "stdout", f"rank {r} batch {batch} line {i} " + "x" * 60)
                for r in range(16) for i in range(100)]
        _feed(dash, RunUpdate(batch, logs=logs))
    assert len(dash.log_panes.children) == 16
    assert all(p.value == "" for p in dash.log_panes.children)  # closed panes are never sent
    assert dash.log_panes.titles[5].startswith("rank 5 10.0.0.6 - 3000 lines, last 200 shown")
    dash.log_panes.selected_index = 5  # the user opens rank 5
    pane = dash.log_panes.children[5].value
    assert pane.count("\n") == 199 and "rank 5 batch 29 line 99" in pane
    assert len(pane) < 200 * 120


def test_worker_error_is_shown_with_rank_host_and_traceback() -> None:
    dash = RunDashboard("boom")
    _feed(dash, RunUpdate(1.0, workers=[_placement(r) for r in range(4)]))
    _feed(dash, RunUpdate(2.0, errors=[{
        "kind": "error", "rank": 2, "host": "10.0.0.3", "node_id": "n", "slice": "tpu-v6e-4x4-0",
        "worker_id": 2, "error": "ValueError: bad batch",
        "traceback": "Traceback (most recent call last):\n  File \"cell\", line 3\nValueError: bad batch"}]))
    assert "rank 2 on host 10.0.0.3" in dash.message.value
    assert "line 3" in dash.message.value
    _end(dash, error="rank 2 ...", wall_s=3.0)
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


def _finished(name: str = "static", ranks: int = 4, steps: int = 20, keys=("loss", "acc"),
              live: bool = True) -> RunDashboard:
    dash = RunDashboard(name, live=live)
    _feed(dash, RunUpdate(0.5, workers=[_placement(r) for r in range(ranks)],
                             slices=["tpu-v6e-4x4-0"],
                             logs=[(0, "stdout", "hello <b>"), (1, "stderr", "warn")]))
    for step in range(steps):
        _feed(dash, RunUpdate(step, records=[
            {"report": step, "rank": r, "time_s": float(step), "step": step,
             **{k: 1.0 / (step + 1) + 0.001 * r * i for i, k in enumerate(keys)}}
            for r in range(ranks)]))
    _end(dash, wall_s=21.0, storage_path="/tmp/ray_results/static",
         slice_names=["tpu-v6e-4x4-0"])
    return dash


def test_static_html_has_chart_placement_summary_and_logs() -> None:
    dash = _finished()
    html = dash.static_html()
    assert "<script" not in html and "Plotly" not in html
    assert '<img class="raytpu-svg"' in html  # the chart, kept by untrusted sanitizing
    assert "/tmp/ray_results/static" in html and "10.0.0.4" in html
    assert "hello &lt;b&gt;" in html and "<details>" in html
    fig = dash.static_figure()
    assert fig.layout.updatemenus[0].buttons[0].label == "loss"
    visible = [t for t in fig.data if t.visible is not False]
    assert len(visible) == 4 * 3


def test_finished_chart_bundle_is_small_safe_and_downsampled() -> None:
    import json
    import xml.etree.ElementTree as ET

    dash = _finished("long", ranks=8, steps=5000, keys=("loss", "acc", "lr", "grad_norm"),
                     live=False)
    bundle = dash.static_chart_bundle()
    assert set(bundle) == {"application/vnd.plotly.v1+json", "image/svg+xml", "text/plain"}
    fig = bundle["application/vnd.plotly.v1+json"]
    text = json.dumps(bundle)
    assert "Plotly.newPlot" not in text and "plotly.min.js" not in text and "<script" not in text
    assert "template" not in fig["layout"]
    assert all(len(t["x"]) <= 2000 for t in fig["data"])
    assert len(fig["data"]) == 8 * (4 + 2)
    root = ET.fromstring(bundle["image/svg+xml"])
    paths = [e for e in root.iter("{http://www.w3.org/2000/svg}path") if e.get("class") == "trace"]
    assert len(paths) == 8 * 3 and all(p.get("d", "").count("L") >= 100 for p in paths)
    tables = dash.static_tables_bundle()
    assert "<script" not in tables["text/html"] and "10.0.0.4" in tables["text/html"]
    size = len(text) + len(json.dumps(tables))
    assert size < 200_000, size  # what a finished run adds to the notebook


def test_dropdown_sits_above_the_subplot_titles() -> None:
    fig = _finished().static_figure()
    menu = fig.layout.updatemenus[0]
    title = fig.layout.annotations[0]
    assert menu.yanchor == "bottom" and menu.y >= title.y + 0.15  # clear of the metric's label
    assert menu.xanchor == "right" and menu.x == 1.0


class _Handle:
    def __init__(self) -> None:
        self.updates: list[dict] = []

    def update(self, data: dict, raw: bool = False) -> None:
        assert raw
        self.updates.append(data)


def test_freeze_replaces_both_outputs_and_closes_every_widget() -> None:
    dash = _finished()
    dash._handles = [_Handle(), _Handle()]
    handles = list(dash._handles)
    widgets = dash._all_widgets()
    assert len(widgets) > 10 and not dash.closed
    dash.freeze()
    chart, tables = handles[0].updates[-1], handles[1].updates[-1]
    assert "application/vnd.plotly.v1+json" in chart and "image/svg+xml" in chart
    assert "application/vnd.jupyter.widget-view+json" not in chart
    assert "Placement" in tables["text/html"]
    assert dash.closed and all(x.comm is None for x in widgets)
    dash.freeze()  # twice is harmless
    assert len(handles[0].updates) == 1


def _chart_feed(dash: RunDashboard) -> list[dict]:
    sent: list[dict] = []
    dash.chart.send = sent.append  # what would go over the comm
    return sent


def _replay(messages: list[dict]) -> dict:
    """The view's state after ``messages`` (run_chart.js's onMsg, in Python)."""
    state: dict = {"gen": None, "series": {}}
    for m in messages:
        if m["type"] == "full":
            state = {"gen": m["gen"], "series": {}}
        elif m["type"] == "thin":
            assert m["from_gen"] == state["gen"]
            k = m["factor"]
            state["gen"] = m["gen"]
            for ranks in state["series"].values():
                for t in ranks.values():
                    t[0], t[1] = t[0][::k], t[1][::k]
            continue
        elif m["gen"] != state["gen"]:
            continue
        for panel, ranks in m["series"].items():
            for rank, (xs, ys) in ranks.items():
                t = state["series"].setdefault(panel, {}).setdefault(rank, [[], []])
                t[0] += xs
                t[1] += ys
    return state


def test_live_chart_sends_only_new_points_and_stays_under_500_kb() -> None:
    import json

    from raytpu_lab.train.streams import Throttle

    clock = [0.0]
    dash = RunDashboard("feed")
    dash._chart_throttle = Throttle(0.5, clock=lambda: clock[0])  # 2 pushes/s, simulated time
    sent = _chart_feed(dash)
    dash.chart._on_view_msg(dash.chart, {"type": "request_full"}, [])  # a view renders
    assert sent[-1]["type"] == "full" and sent[-1]["series"]["loss"] == {}
    for step in range(3000):  # a long run: 8 ranks, 10 reports/s for 5 minutes
        clock[0] = step * 0.1
        _feed(dash, RunUpdate(step * 0.1, records=[
            {"report": step, "rank": r, "time_s": step * 0.1, "step": step, "loss": 1 / (step + 1)}
            for r in range(8)]))
    kinds = [m["type"] for m in sent]
    assert kinds.count("full") == 1 and 1 <= kinds.count("thin") <= 6, kinds  # the view thins
    total = sum(len(json.dumps(m)) for m in sent)
    assert total < 500_000, total
    view = _replay(sent)
    for panel in ("loss", "step_time_s", "steps_per_s"):
        for rank in map(str, range(8)):
            xs = view["series"][panel][rank][0]
            assert xs == sorted(set(xs)) and len(xs) <= 200  # no duplicate, bounded
            assert xs[-1] >= 2900
    _end(dash, wall_s=300.0)  # the final push
    newest = [sent[-1]["tail"].get("loss", [None])[0],
              *sent[-1]["series"].get("loss", {}).get("0", [[None]])[0][-1:]]
    assert 2999 in newest  # the newest point is always drawn
    print(f"live chart: {len(sent)} messages, {total} bytes for 3000 steps x 8 ranks")


def test_epoch_only_run_charts_its_metric_against_reports() -> None:
    dash = RunDashboard("epochs", redraw_interval_s=0.0)
    sent = _chart_feed(dash)
    for e in range(5):
        _feed(dash, RunUpdate(float(e), records=[
            {"report": e, "rank": r, "time_s": float(e), "epoch": e, "val_loss": 1 / (e + 1)}
            for r in range(2)]))
    assert dash.chart.key == "val_loss" and dash.chart.xlabel == "report"
    view = _replay(sent)
    assert set(view["series"]["val_loss"]) == {"0", "1"}
    assert view["series"]["val_loss"]["1"][1][-1] == 0.2


def test_picking_a_metric_in_the_view_resends_that_metric() -> None:
    dash = RunDashboard("pick", redraw_interval_s=0.0)
    sent = _chart_feed(dash)
    _feed(dash, RunUpdate(1.0, records=_records(0, 0.0) + _records(1, 1.0)))
    dash.chart.key = "acc"  # what the view's <select> sets
    assert sent[-1]["type"] == "full" and sent[-1]["panels"][0] == "acc"
    assert dash._key == "acc"
    assert set(sent[-1]["series"]["acc"]) == {"0", "1", "2", "3"}


def test_closed_maps_and_dashboards_are_collected_and_the_refresher_ends() -> None:
    import gc
    import weakref

    from raytpu_lab.session.refresher import Refresher
    from raytpu_lab.state.model import ClusterSnapshot
    from raytpu_lab.widgets.topology_map import TopologyMap

    snap = ClusterSnapshot(0.0, [], [], None)
    refresher = Refresher(lambda: snap, interval_s=0.05)
    refs = []
    for i in range(1000):
        m = TopologyMap(snap)
        refresher.add(m)
        if i % 2:
            m.update(snap)
        refs.append(weakref.ref(m))
        m.close()
        del m
    for i in range(50):
        d = RunDashboard(f"d{i}")
        _feed(d, RunUpdate(1.0, workers=[_placement(0)], records=_records(0, 0.0),
                              logs=[(0, "stdout", "x")]))
        _end(d, wall_s=1.0)
        refs.append(weakref.ref(d))
        d.freeze()
        del d
    gc.collect()
    alive = sum(r() is not None for r in refs)
    assert alive == 0, f"{alive} of 1050 closed views still alive"
    deadline = time.monotonic() + 5
    while refresher.running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not refresher.running  # the refresher thread ended with its last view


def test_a_run_reporting_only_epoch_says_reports_not_zero_steps() -> None:
    dash = RunDashboard("epochs", redraw_interval_s=0.0)
    _feed(dash, RunUpdate(0.1, workers=[_placement(0)]))
    rows = [{"report": i, "rank": 0, "time_s": 2.0 * i, "epoch": i, "loss": 1.0} for i in range(5)]
    _feed(dash, RunUpdate(8.0, records=rows))
    assert "5 reports, 0.50 reports/s" in dash.text(), dash.text()
    _feed(dash, RunUpdate(9.0, records=[{**_records(3, 10.0)[0], "report": 5}]))
    assert "4 steps" in dash.text(), dash.text()


def test_the_dashboard_reads_the_runs_result_and_keeps_no_copy() -> None:
    dash = RunDashboard("one", live=False)
    _feed(dash, RunUpdate(1.0, workers=[_placement(0)], records=_records(0, 0.0),
                          logs=[(0, "stdout", "hi")]))
    result = _result(dash)
    assert dash.result is result
    result.records.append({"report": 1, "rank": 0, "time_s": 2.0, "step": 1, "loss": 0.5})
    assert "2 steps" in dash.text()  # drawn from the result, not from a second fold
    try:
        dash.on_update(RunUpdate(2.0))
    except ValueError as err:
        assert "absorb" in str(err)
    else:
        raise AssertionError("an update folded into no result was taken")
