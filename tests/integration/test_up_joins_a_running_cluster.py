"""``Lab.up`` of a shape the running cluster of that name already holds joins it (as a notebook
re-run after a kernel restart does) and its ``down`` leaves it running; a shape it does not hold
is refused with the usual "already running" error, and nothing is started."""

from __future__ import annotations

import pytest
import ray

from raytpu_lab.cluster import _process_groups, emulator
from raytpu_lab.errors import EmulatorError
from raytpu_lab.lab import Lab

from .conftest import connected_to, wait_until


def test_up_joins_the_running_cluster_and_down_leaves_it(cluster) -> None:
    if ray.is_initialized():
        ray.shutdown()  # Lab.up connects this process itself
    session = Lab()
    joined = session.up("v4:2x2x2", 2)
    assert joined.head_pid == cluster.head_pid and session.started_cluster is None
    assert session.connected and connected_to(cluster)
    assert session.down() is None  # nothing of this session's to stop
    assert cluster.is_running()


def test_up_of_a_shape_it_lacks_is_refused_and_starts_nothing(cluster) -> None:
    session = Lab()
    with pytest.raises(EmulatorError, match="already running") as info:
        session.up("v6e:4x4", 3)
    # How to stop it, in the caller's terms: Python here; a cell or a shell spells it its way.
    assert "lab.down(name='raytpu')" in str(info.value)
    assert "%raytpu down --name raytpu" in info.value.spelled("cell")
    assert "raytpu down --name raytpu" in info.value.spelled("shell")
    assert [c.name for c in emulator.running()] == [cluster.name]
    assert not session.connected


def _exited(proc) -> bool:
    """Whether a process has exited (a zombie not yet reaped by its parent has)."""
    import psutil

    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.timeout(300)  # seen once: ray.init waiting 600 s on the fresh head's GCS
@pytest.mark.slow
def test_up_over_a_half_stopped_cluster_starts_a_fresh_one(cluster) -> None:
    """A kernel killed while it stopped its cluster leaves processes whose GCS no longer answers
    (a user's kernel restart): ``up`` of that name stops what is left and starts anew instead of
    trying to join it."""
    import psutil

    if ray.is_initialized():
        ray.shutdown()
    name = "rt-stale"
    stale = emulator.up([("v5litepod:2x2", 1)], name=name, timeout_s=600)
    gcs = [p for p in psutil.process_iter(["cmdline"])
           if "gcs_server" in " ".join(p.info["cmdline"] or [])
           and _process_groups.in_cluster(p.pid, str(stale.folder))]
    assert gcs, "the head has a GCS"
    for proc in gcs:
        proc.kill()
    # A kill is delivered asynchronously: until the GCS has exited its port may still accept a
    # connection, and `up` would rightly join a head that seems to answer.
    assert wait_until(lambda: all(_exited(p) for p in gcs), 30), "the killed GCS still runs"
    session = Lab()
    try:
        fresh = session.up("v5litepod:2x2", 1, name=name, timeout_s=600)
        assert fresh.head_pid != stale.head_pid and session.started_cluster is fresh
        assert session.connected
    finally:
        session.down()
        for c in emulator.running():
            if c.name == name:
                c.down()
    assert name not in [c.name for c in emulator.running()]
