"""The worker tap's own rows (placement, error, summary), on a plain list standing in for the queue.

Only our wrapper runs here; where the worker runs (``_placement``, which reads Ray's runtime
context) is replaced by a fixed row. The real queue path runs in the integration tests.
"""

from __future__ import annotations

from typing import Any

import pytest

from raytpu_lab.train import worker_tap


class _ListQueue:
    def __init__(self) -> None:
        self.items: list[Any] = []

    def put_nowait(self, item: Any) -> None:
        self.items.append(item)


@pytest.fixture()
def tapped(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(worker_tap, "_placement", lambda: {
        "kind": "placement", "rank": 3, "node_id": "n1", "host": "10.0.0.2", "slice": "s0",
        "worker_id": 1})
    events, logs = _ListQueue(), _ListQueue()

    def tap(fn, **kwargs):
        return worker_tap.tap_train_fn(fn, events, logs, flush_interval_s=0.01, **kwargs)
    return tap, events


def _kinds(events: _ListQueue) -> list[str]:
    assert all(item["kind"] == "tap" for item in events.items)
    return [row["kind"] for item in events.items for row in item["rows"]]


def test_summary_follows_the_function_with_the_rank(tapped) -> None:
    tap, events = tapped
    wrapped = tap(lambda config: config["x"] * 2, worker_summary=lambda: {"xla_compile_count": 5})
    assert wrapped({"x": 21}) == 42
    assert _kinds(events) == ["placement", "timing", "summary"]
    assert events.items[2] == {"kind": "tap", "rows": [
        {"kind": "summary", "rank": 3, "summary": {"xla_compile_count": 5}}]}


def test_summary_is_sent_after_the_error_and_a_failing_summary_masks_nothing(tapped) -> None:
    tap, events = tapped

    def broken() -> None:
        raise ValueError("bad batch")

    def no_summary() -> dict[str, Any]:
        raise RuntimeError("torch_xla metrics unavailable")

    with pytest.raises(ValueError, match="bad batch"):
        tap(broken, worker_summary=lambda: {"xla_compile_count": 1})()
    assert _kinds(events) == ["placement", "error", "timing", "summary"]
    events.items.clear()
    with pytest.raises(ValueError, match="bad batch"):
        tap(broken, worker_summary=no_summary)()
    assert _kinds(events) == ["placement", "error", "timing"]


def test_without_a_summary_function_nothing_more_is_sent(tapped) -> None:
    tap, events = tapped
    assert tap(lambda: "done")() == "done"
    assert _kinds(events) == ["placement", "timing"]


def test_timing_row_times_every_report_without_changing_the_function(tapped, monkeypatch) -> None:
    import time

    from raytpu_lab import _ray_private

    class _Utils:  # Ray Train's per-worker TrainFnUtils, outside a run
        def report(self, metrics, checkpoint=None):
            time.sleep(0.05)
            seen.append((metrics, checkpoint))

    seen: list[tuple] = []
    utils = _Utils()
    monkeypatch.setattr("ray.train.v2._internal.execution.train_fn_utils.get_train_fn_utils",
                        lambda: utils)
    tap, events = tapped

    def train(config):
        time.sleep(0.1)  # "compile"
        for step in range(2):
            utils.report({"step": step})
        utils.report({"step": 2}, checkpoint="ckpt")
        return "ok"

    before = time.time()
    assert tap(train)({}) == "ok"
    assert "report" not in utils.__dict__  # Ray's own report is back after the run
    assert [m["step"] for m, _ in seen] == [0, 1, 2]
    row = events.items[1]["rows"][0]
    assert row["kind"] == "timing" and row["rank"] == 3
    assert before <= row["fn_start"] < row["reports"][0][0] < row["fn_end"] <= time.time()
    assert row["reports"][0][0] - row["fn_start"] >= 0.1
    assert [c for _, _, c in row["reports"]] == [False, False, True]
    assert all(0.05 <= e - s < 1 for s, e, _ in row["reports"])
    assert row["process_start"] is not None and row["process_start"] < before

    # Nested hooks (the profiler's inside ours): undoing the inner one keeps the outer one.
    undo_outer = _ray_private.wrap_train_report(lambda r, *a, **k: r(*a, **k))
    outer = utils.__dict__["report"]
    undo_inner = _ray_private.wrap_train_report(lambda r, *a, **k: r(*a, **k))
    undo_inner()
    assert utils.__dict__["report"] is outer
    undo_outer()
    assert "report" not in utils.__dict__


def test_ray_info_chatter_stays_out_of_the_panes_warnings_and_user_logs_do_not() -> None:
    import logging
    import sys

    logs = _ListQueue()
    tee = worker_tap._Tee(0, logs, interval_s=60.0, max_lines=100)
    loggers = [logging.getLogger(n) for n in ("ray.train.tap_test", "mymodel.tap_test")]
    tee.start()
    try:
        handler = logging.StreamHandler(sys.stderr)  # bound to the tee's stderr, as Ray's console
        for lg in loggers:
            lg.addHandler(handler)
            lg.propagate = False
            lg.setLevel(logging.INFO)
        loggers[0].info("Reporting training result 1")
        loggers[0].warning("worker group restarted")
        loggers[1].info("epoch 1 done")
        print("to stderr", file=sys.stderr)
    finally:
        tee.stop()
        for lg in loggers:
            lg.removeHandler(handler)
    shipped = [text for item in logs.items for _, text in item["lines"]]
    assert shipped == ["worker group restarted", "epoch 1 done", "to stderr"]
