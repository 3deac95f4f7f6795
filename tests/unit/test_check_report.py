"""The smoke test's table (pure): rows, statuses and the mime bundle."""

from __future__ import annotations

from raytpu_lab.reservations.check_report import CheckReport, HostCheck


def _ok(worker: int) -> HostCheck:
    return HostCheck("tpu-v4-2x2x2-0", worker, f"10.0.0.{worker}", worker, "ok", reservation="r1",
                     expected_devices=8, expected_local=4, process_index=worker, process_count=2,
                     device_count=8, local_device_count=4, psum=8.0, init_s=1.0, first_s=0.5,
                     collective_s=0.002)


def test_a_passing_check_is_a_small_table_without_scripts() -> None:
    report = CheckReport([_ok(0), _ok(1)], timeout_s=60, wall_s=3.2)
    assert report.ok and not report.failed
    bundle = report._repr_mimebundle_()
    assert set(bundle) == {"text/plain", "text/html"}
    assert "<script" not in bundle["text/html"] and bundle["text/html"].count("<tr>") == 3
    lines = bundle["text/plain"].splitlines()
    assert lines[0].split()[:3] == ["host", "ip", "rank"]
    assert "tpu-v4-2x2x2-0 worker 1" in lines[2] and "2.0 ms" in lines[2]
    assert lines[-1].startswith("2 of 2 hosts ok")


def test_failures_are_named_and_skipped_slices_do_not_count() -> None:
    hung = HostCheck("tpu-v4-2x2x2-0", 1, "10.0.0.1", 1, "timeout", expected_devices=8,
                     expected_local=4, detail="no answer within 5 s")
    wrong = _ok(0)
    wrong.device_count, wrong.status = 4, "wrong"
    skipped = HostCheck("tpu-v4-2x2x2-1", -1, "", 0, "not checked", detail="degraded: worker 1 missing")
    report = CheckReport([wrong, hung, skipped], timeout_s=5, wall_s=5.1)
    assert not report.ok and [h.worker_id for h in report.failed] == [0, 1]
    assert "failed: tpu-v4-2x2x2-0 worker 0 (wrong), tpu-v4-2x2x2-0 worker 1 (timeout)" in report.summary()
    assert "4 (want 8)" in report.text() and "not checked: degraded: worker 1 missing" in report.text()
    assert not CheckReport([skipped]).ok  # nothing checked is not a pass
