"""The smoke test names a host that errs and one that hangs within its timeout, and kills the
stuck process (on a v4 2x2x2 slice, 2 hosts, of the session's shared cluster). The check's
happy paths, on a cluster of their own: test_check.py."""

from __future__ import annotations

import time

from raytpu_lab.lab import Lab
from raytpu_lab.reservations.check import check_reservation

from .conftest import host_processes, wait_until


def test_a_host_that_errs_and_one_that_hangs_are_named_within_the_timeout(lab: Lab) -> None:
    res = lab.reserve("2x2x2", "v4", name="chk-bad", timeout_s=30)

    def probe(rank: int, n: int, coordinator: str | None, timeout_s: float) -> dict:
        if rank == 0:
            raise ValueError("no chips here")
        time.sleep(600)  # a host stuck (e.g. in a collective waiting for a peer)
        return {}

    try:
        start = time.monotonic()
        report = check_reservation(res, timeout_s=8, probe=probe)
        assert time.monotonic() - start < 40
        assert [(h.worker_id, h.status) for h in report.hosts] == [(0, "error"), (1, "timeout")]
        assert "ValueError: no chips here" in report.hosts[0].detail
        assert "no answer within 8 s" in report.hosts[1].detail
        assert not report.ok
        assert f"{res.slice_names[0]} worker 1 (timeout)" in report.summary()
        assert wait_until(lambda: host_processes() == 0, 15)  # the stuck process was killed
    finally:
        lab.release("chk-bad")
