"""Profile analysis: on a trace captured once (4 hosts of a v6e 4x4, steps 1:3, rank 1 slow in
step 2, ``jit(step)`` recompiled) and on small hand-made trace events with known answers."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from raytpu_lab.train.profile_analysis import (
    HostTrace,
    build_report,
    hlo_stats_ops,
    skew_matrix,
    step_breakdown,
    top_ops,
)
from raytpu_lab.train.profile_load import load_profile
from raytpu_lab.widgets.profile_view import ProfileView

FIXTURE = Path(__file__).parent / "fixtures" / "profile_v6e_4x4_window_1_3"


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory):
    """The fixture as a run's storage folder (``<run>/profile/rank.../``), traces un-gzipped."""
    run = tmp_path_factory.mktemp("run")
    shutil.copytree(FIXTURE, run / "profile")
    for gz in (run / "profile").rglob("*.xplane.pb.gz"):
        gz.with_suffix("").write_bytes(gzip.decompress(gz.read_bytes()))
        gz.unlink()
    return load_profile(str(run), (1, 3))


def test_every_host_and_traced_step_is_broken_down(report) -> None:
    assert report.message is None
    assert [h.split(" (")[1] for h in report.hosts] == ["rank 0)", "rank 1)", "rank 2)", "rank 3)"]
    assert all(h.startswith("tpu-v6e-4x4-0 w") for h in report.hosts)
    assert sorted((b.rank, b.step) for b in report.breakdown) == [
        (r, s) for r in range(4) for s in (1, 2)]
    for b in report.breakdown:
        assert b.step_s > 0 and min(b.compile_s, b.execute_s, b.report_s, b.host_s) >= 0
        assert b.compile_s + b.execute_s + b.report_s + b.host_s == pytest.approx(b.step_s)
        assert b.compile_s > 0.05  # jit(step) compiled again in both traced steps
        assert b.execute_s > 0
    assert report.trace_compiles == {h: 2 for h in report.hosts}
    totals = report.host_totals()
    assert [t["steps"] for t in totals] == [2, 2, 2, 2]


def test_the_slow_rank_is_the_straggler(report) -> None:
    assert report.straggler() == report.hosts[1]
    col = report.skew_steps.index(2)
    assert report.skew_s[1][col] > 0.25  # it slept 0.3 s in step 2
    assert all(abs(row[col]) < 0.1 for i, row in enumerate(report.skew_s) if i != 1)


def test_top_ops_are_xla_ops_from_the_trace(report) -> None:
    assert report.ops_source == "trace events"  # XProf's hlo_stats is empty on CPU
    names = [o.name for o in report.ops]
    assert 5 <= len(names) <= 10 and len(set(names)) == len(names)
    assert {o.module for o in report.ops} == {"jit_step"}
    assert any(n.startswith("all-reduce") for n in names)
    assert [o.self_s for o in report.ops] == sorted((o.self_s for o in report.ops), reverse=True)
    assert all(0 < o.self_s <= o.total_s + 1e-12 and o.occurrences >= 4 for o in report.ops)


def test_recompilations_from_the_jax_compile_log(report) -> None:
    step_fn = report.compiles[0]
    assert (step_fn.fun_name, step_fn.compiles_per_rank, step_fn.recompiles) == ("jit(step)", 3, 2)
    assert step_fn.steps == (0, 1, 2)
    assert all(c.recompiles == 0 for c in report.compiles[1:])


def test_profile_view_text_and_html(report) -> None:
    view = ProfileView(report)
    text = view.text()
    assert "Profile of steps 1:3 on 4 hosts" in text
    assert f"Straggler: {report.hosts[1]}" in text
    assert "Recompilations: jit(step) x2 (steps 0, 1, 2)" in text
    assert f"xprof server --logdir {report.logdir} --port 8791" in text
    html = view._repr_mimebundle_()["text/html"]
    assert "Plotly" not in html and "<script" not in html  # the figure is its own plotly output
    assert view.figure_bundle()["application/vnd.plotly.v1+json"]["data"]
    svg = view.figure_bundle()["image/svg+xml"]  # what viewers without plotly show
    assert svg.startswith("<svg") and svg.count("<rect") >= len(report.hosts)
    assert all(host in svg for host in report.hosts)
    assert "all-reduce" in html and "jit(step)" in html
    fig = view.figure()
    assert [t.type for t in fig.data] == ["bar"] * 4 + ["heatmap"]


def test_a_run_that_never_reached_the_window_says_so(tmp_path: Path) -> None:
    meta = {"rank": 0, "slice_name": "s", "worker_id": "0", "reports": 20, "steps": [],
            "compiles": [], "traced_steps": []}
    r = build_report([HostTrace(meta=meta)], (50, 60), str(tmp_path))
    assert r.message == "profile window 50:60 never reached: the run reported 20 steps"
    assert r.breakdown == [] and "never reached" in ProfileView(r).text()
    empty = load_profile(str(tmp_path / "nothing"), (1, 2))
    assert empty.message is not None and "no profile was written" in empty.message
    assert "no profile was written" in ProfileView(empty).html()


def _ev(name: str, ts: float, dur: float, tid: int = 1, **args: str) -> dict:
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 7, "tid": tid, "args": args}


def test_step_breakdown_on_known_events() -> None:
    trace = {"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "/host:CPU"}},
        _ev("train 4", 0, 1000, step_num="4"),
        _ev("backend_compile_and_load", 100, 200),
        _ev("fusion", 250, 150, tid=2, hlo_op="fusion", hlo_module="jit_f"),  # 50 us in compile
        _ev("dot", 500, 100, tid=2, hlo_op="dot", hlo_module="jit_f"),
        _ev("ray.train.report", 700, 250),
        _ev("dot", 900, 50, tid=3, hlo_op="dot", hlo_module="jit_f"),  # inside the report
    ]}
    (b,) = step_breakdown(HostTrace(meta={"rank": 3, "slice_name": "s", "worker_id": "1"}, trace=trace))
    assert (b.rank, b.step) == (3, 4)
    assert b.step_s == pytest.approx(1e-3)
    assert b.compile_s == pytest.approx(200e-6)
    assert b.execute_s == pytest.approx(200e-6)  # 100 of fusion outside compile + dot 100
    assert b.report_s == pytest.approx(250e-6)
    assert b.host_s == pytest.approx(350e-6)


def test_top_ops_self_time_excludes_nested_ops() -> None:
    trace = {"traceEvents": [
        _ev("while", 0, 100, hlo_op="while", hlo_module="m"),
        _ev("dot", 10, 30, hlo_op="dot", hlo_module="m"),
        _ev("add", 50, 20, hlo_op="add", hlo_module="m"),
        _ev("dot", 200, 30, tid=2, hlo_op="dot", hlo_module="m"),
        _ev("python", 0, 500, tid=9),  # not an XLA op
    ]}
    ops = {o.name: o for o in top_ops(HostTrace(meta={"rank": 0}, trace=trace))}
    assert set(ops) == {"while", "dot", "add"}
    assert ops["while"].self_s == pytest.approx(50e-6) and ops["while"].total_s == pytest.approx(100e-6)
    assert ops["dot"].occurrences == 2 and ops["dot"].self_s == pytest.approx(60e-6)


def test_hlo_stats_table_is_read_when_xprof_fills_it() -> None:
    cols = [{"id": i} for i in ("rank", "program_id", "hlo_op_name", "occurrences", "total_time",
                                 "total_self_time")]
    rows = [{"c": [{"v": 1}, {"v": "p1"}, {"v": "fusion.1"}, {"v": 3}, {"v": 900.0}, {"v": 600.0}]},
            {"c": [{"v": 2}, {"v": "p1"}, {"v": "all-reduce"}, {"v": 3}, {"v": 2000.0}, {"v": 2000.0}]}]
    host = HostTrace(meta={"rank": 0}, hlo_stats={"cols": cols, "rows": rows})
    ops = hlo_stats_ops(host)
    assert [(o.name, o.self_s, o.total_s) for o in ops] == [
        ("all-reduce", pytest.approx(2e-3), pytest.approx(2e-3)),
        ("fusion.1", pytest.approx(6e-4), pytest.approx(9e-4))]
    assert hlo_stats_ops(HostTrace(meta={"rank": 0}, hlo_stats={"cols": [], "rows": []})) == []
    report = build_report([host], (0, 1), "/x")
    assert report.ops_source == "xprof hlo_stats" and report.ops[0].name == "all-reduce"


def test_skew_is_work_before_report_minus_the_median_host() -> None:
    def host(rank: int, busy: list[float]) -> HostTrace:
        return HostTrace(meta={"rank": rank, "slice_name": "s", "worker_id": str(rank),
                               "steps": [{"step": i, "busy_s": b, "report_s": 0.0}
                                         for i, b in enumerate(busy)]})
    labels, steps, skew = skew_matrix([host(1, [1.0, 2.0]), host(0, [1.0, 1.0]),
                                       host(2, [1.0])])
    assert labels == ["s w0 (rank 0)", "s w1 (rank 1)", "s w2 (rank 2)"]
    assert steps == [0, 1]
    assert skew == [[0.0, -0.5], [0.0, 0.5], [0.0, None]]


def test_skew_on_the_topology_map_marks_the_straggler_host(report) -> None:
    import json
    import xml.etree.ElementTree as ET

    from raytpu_lab.state import build_snapshot

    raw = json.loads((FIXTURE.parent / "raw_v6e_4x4_x2_idle.json").read_text())
    view = ProfileView(report, snapshot=build_snapshot(raw))
    svg = view.skew_map()
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    hosts = {(g.get("data-slice"), int(g.get("data-worker"))): g.get("data-heat")
             for g in root.iter(f"{ns}g") if g.get("class") == "host"}
    assert set(hosts) == {("tpu-v6e-4x4-0", w) for w in range(4)}  # only the run's slice
    slow = report.slots[1]  # rank 1 slept
    assert hosts[slow] == "#ff3030"
    assert all(c != "#ff3030" for slot, c in hosts.items() if slot != slow)
    assert "profile skew" in svg and "Skew per host on the map" in view.html()
    assert ProfileView(report).skew_map() == ""
