"""The load's statistics (percentiles, windows, streaming) and its panel's small mime bundle."""

from __future__ import annotations

import pytest

from raytpu_lab.errors import RaytpuError
from raytpu_lab.serve.load import run_load
from raytpu_lab.serve.loadstats import LoadStats, Sample, percentile
from raytpu_lab.widgets.serve_panel import LoadPanel


def test_percentiles_are_linear_between_ranks() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0 and percentile([], 50) is None


def _stats() -> LoadStats:
    samples = [Sample(sent_s=i * 0.1, latency_s=0.01 * (i + 1), ok=i != 3,
                      status=200 if i != 3 else 503, chunks=3, first_chunk_s=0.005,
                      inter_chunk_s=0.002) for i in range(20)]
    return LoadStats(rps=10, duration_s=2, concurrency=4, samples=samples)


def test_windows_and_summary_count_what_was_sent() -> None:
    stats = _stats()
    rows = stats.windows()
    assert [r["t"] for r in rows] == [0.0, 1.0]
    assert rows[0]["errors"] == 1 and rows[0]["rps"] == 9 and rows[1]["rps"] == 10
    s = stats.summary()
    assert (s["sent"], s["ok"], s["errors"], s["first_error"]) == (20, 19, 1, "HTTP 503")
    assert s["streaming"] and s["ttfc_p50"] == 0.005 and s["itl_p50"] == 0.002
    assert s["p50"] == pytest.approx(0.11)


def test_the_panel_is_a_small_bundle_with_drawn_series_and_no_script() -> None:
    bundle = LoadPanel("echo", _stats(), {"status": "RUNNING", "deployments": {
        "Echo": {"status": "HEALTHY", "running": 1, "target": 1}}}, done=True)._repr_mimebundle_()
    page = bundle["text/html"]
    assert "<script" not in page and "plotly" not in page.lower() and len(page) < 20_000
    assert page.count('class="series"') == 7  # rps, errors, p50, p90, p99, ttfc, inter-chunk
    assert "1/1" in page and "HEALTHY" in page
    assert "20 sent, 19 ok, 1 errors" in bundle["text/plain"]


def test_a_load_refuses_a_rate_of_zero_before_sending() -> None:
    with pytest.raises(RaytpuError, match="rps=0"):
        run_load("http://127.0.0.1:9/x", rps=0, duration_s=1)


def test_a_load_against_nothing_counts_errors_and_stops_at_its_duration() -> None:
    import time

    start = time.monotonic()
    stats = run_load("http://127.0.0.1:9/x", rps=20, duration_s=0.5, concurrency=2, timeout_s=1)
    assert time.monotonic() - start < 3
    s = stats.summary()
    assert s["sent"] == 10 and s["errors"] == 10 and "ConnectionRefusedError" in s["first_error"]
