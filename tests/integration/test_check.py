"""The smoke test (``Session.check``, ``%raytpu check``) on one v4 2x2x2 slice: two hosts of
4 chips each, so JAX must see 8 devices in all and 4 per host, and a psum of ones gives 8;
nothing is left running. Its own small cluster (one slice, 2 hosts): the check of every idle
slice runs on all of them. A host that errs and one that hangs: test_check_faults.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import ray
from IPython import get_ipython
from IPython.testing.globalipapp import start_ipython

from raytpu_lab.lab import Lab, use_session
from raytpu_lab.reservations.check_report import CheckReport

from .conftest import host_processes, live_placement_groups, wait_until

pytestmark = pytest.mark.slow  # its own cluster (~30 s to start); the fault case is quick: test_check_faults.py


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    if ray.is_initialized():
        ray.shutdown()  # Lab.up connects this process itself
    session = Lab()
    session.up("v4:2x2x2", 1, name="chk", timeout_s=300)
    try:
        with use_session(session):
            yield session
    finally:
        session.down()


def test_check_reports_device_counts_per_host_and_a_blocked_psum(lab: Lab) -> None:
    res = lab.reserve("2x2x2", "v4", name="chk", timeout_s=30)
    try:
        ip = start_ipython() or get_ipython()
        ip.run_line_magic("load_ext", "raytpu_lab")
        report = ip.run_line_magic("raytpu", "check chk --timeout 90")
        assert isinstance(report, CheckReport)
        assert report.ok, report.text()
        rows = [(h.slice_name, h.worker_id, h.process_index, h.device_count, h.local_device_count,
                 h.psum) for h in report.hosts]
        assert rows == [(res.slice_names[0], 0, 0, 8, 4, 8.0), (res.slice_names[0], 1, 1, 8, 4, 8.0)]
        assert all(h.collective_s is not None and 0 < h.collective_s < 30 for h in report.hosts)
        bundle = report._repr_mimebundle_()
        assert "<table" in bundle["text/html"] and "<script" not in bundle["text/html"]
        assert "2 of 2 hosts ok" in bundle["text/plain"]
        assert wait_until(lambda: host_processes() == 0, 15)  # temporary processes are gone

        # In the reservation's running per-host session: the check reuses its processes.
        lab.run_on("chk", "x = 1")
        again = lab.check("chk", timeout_s=60)
        assert again.ok, again.text()
        assert all(h.init_s is not None and h.init_s < 1 for h in again.hosts)  # no new init
        assert lab.run_on("chk", "x").values == [1, 1]  # still the same processes
    finally:
        lab.release("chk")


def test_check_without_a_name_checks_every_idle_slice_and_releases_it(lab: Lab) -> None:
    report = lab.check(timeout_s=90)
    assert report.ok, report.text()
    assert [(h.worker_id, h.device_count, h.local_device_count) for h in report.hosts] == \
        [(0, 8, 4), (1, 8, 4)]
    assert report.hosts[0].reservation == f"check-{report.hosts[0].slice_name}"
    assert wait_until(lambda: not live_placement_groups(), 10), live_placement_groups()
    assert wait_until(lambda: host_processes() == 0, 15)
