"""Pure parts of watched runs: log capping, throttling, placement table, chart series, signatures."""

from __future__ import annotations

import pytest

from raytpu_lab.errors import TrainingConfigError
from raytpu_lab.train.streams import (
    PLACEMENT_COLUMNS,
    LogBook,
    Throttle,
    downsample,
    metric_series,
    numeric_keys,
    placement_table,
)
from raytpu_lab.train.worker_tap import accepts_config


def test_logbook_keeps_the_last_lines_per_rank_and_counts_the_rest() -> None:
    book = LogBook(max_lines=100)
    for batch in range(50):  # 16 ranks x 50 batches x 30 lines = 24,000 lines
        for rank in range(16):
            book.add(rank, [("stdout", f"r{rank} b{batch} l{i}") for i in range(30)],
                     dropped=2 if batch == 0 else 0)
    assert book.ranks == list(range(16))
    for rank in range(16):
        tail = book.tail(rank)
        assert len(tail) == 100
        assert tail[-1] == ("stdout", f"r{rank} b49 l29")
        assert book.counts(rank) == (50 * 30 + 2, 50 * 30 - 100 + 2)
    assert len(book.records()) == 16 * 100
    assert book.tail(3, 2) == [("stdout", "r3 b49 l28"), ("stdout", "r3 b49 l29")]
    rev = book.revision(5)
    book.add(5, [("stderr", "x")])
    assert book.revision(5) == rev + 1 and book.tail(5, 1) == [("stderr", "x")]
    assert book.tail(99) == [] and book.counts(99) == (0, 0)


def test_throttle_lets_one_action_through_per_interval() -> None:
    now = [0.0]
    throttle = Throttle(0.5, clock=lambda: now[0])
    allowed = 0
    for _ in range(1000):  # 1,000 attempts over 10 s
        now[0] += 0.01
        allowed += throttle.ready()
    assert 19 <= allowed <= 21


def test_placement_table_sorts_by_rank_and_keeps_a_rank_latest_row() -> None:
    rows = [
        {"kind": "placement", "rank": 1, "slice": "s0", "worker_id": 3, "host": "10.0.0.4",
         "node_id": "ab" * 28, "chips": ["0", "1", "2", "3"], "megascale_slice_id": None, "pid": 7},
        {"kind": "placement", "rank": 0, "slice": "s0", "worker_id": 0, "host": "10.0.0.1",
         "node_id": "cd" * 28, "chips": ["0", "1", "2", "3"], "megascale_slice_id": "0", "pid": 8},
        {"kind": "placement", "rank": 1, "slice": "s1", "worker_id": 2, "host": "10.0.0.9",
         "node_id": "ef" * 28, "chips": [], "pid": 9},
    ]
    table = placement_table(rows)
    assert [r["rank"] for r in table] == [0, 1]
    assert tuple(table[0]) == PLACEMENT_COLUMNS
    assert table[0]["chips"] == "0,1,2,3" and table[0]["node_id"] == "cd" * 6
    assert table[0]["megascale_slice_id"] == "0"
    assert table[1]["slice"] == "s1" and table[1]["worker_id"] == 2 and table[1]["chips"] == ""
    assert placement_table([]) == []


def test_metric_series_uses_steps_and_derives_step_time_and_throughput() -> None:
    rows = [{"report": i, "rank": 0, "time_s": 10.0 + 2.0 * i, "step": 4 * i, "loss": 1.0 / (i + 1)}
            for i in range(5)]
    assert metric_series(rows, "loss") == ([0.0, 4.0, 8.0, 12.0, 16.0], [1.0, 0.5, 1 / 3, 0.25, 0.2])
    assert metric_series(rows, "step_time_s") == ([4.0, 8.0, 12.0, 16.0], [0.5] * 4)
    assert metric_series(rows, "steps_per_s") == ([4.0, 8.0, 12.0, 16.0], [2.0] * 4)
    reported = [{**r, "step_time_s": 0.1} for r in rows]
    assert metric_series(reported, "step_time_s")[1] == [0.1] * 5
    assert metric_series(rows, "missing") == ([], [])
    assert numeric_keys(rows + [{"flag": True, "name": "x", "acc": 0.9}]) == ["loss", "acc", "step"]


def test_downsample_bounds_points_and_keeps_the_last() -> None:
    xs = [float(i) for i in range(10_000)]
    dx, dy = downsample(xs, xs, 300)
    assert len(dx) <= 300 and dx[0] == 0.0 and dx[-1] == 9999.0 and dx == dy
    assert downsample(xs[:10], xs[:10], 300) == (xs[:10], xs[:10])


def _no_args():
    pass


def _config(config):
    pass


def _config_default(config, extra=1):
    pass


def _two(a, b):
    pass


def _kwonly(*, config):
    pass


def _varargs(*args):
    pass


@pytest.mark.parametrize(("fn", "expected"), [
    (_no_args, False), (_config, True), (_config_default, True), (_varargs, True),
    (lambda config=None: None, False),
])
def test_accepts_config_follows_ray_trains_rule(fn, expected) -> None:
    assert accepts_config(fn) is expected


@pytest.mark.parametrize("fn", [_two, _kwonly, 42])
def test_wrong_signatures_are_refused_with_what_to_do(fn) -> None:
    with pytest.raises(TrainingConfigError) as info:
        accepts_config(fn)
    assert "What to do" in str(info.value)
