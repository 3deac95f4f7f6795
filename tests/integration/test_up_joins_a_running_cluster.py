"""``Lab.up`` of a shape the running cluster of that name already holds joins it (as a notebook
re-run after a kernel restart does) and its ``down`` leaves it running; a shape it does not hold
is refused with the usual "already running" error, and nothing is started."""

from __future__ import annotations

import pytest
import ray

from raytpu_lab.cluster import emulator
from raytpu_lab.errors import EmulatorError
from raytpu_lab.lab import Lab

from .conftest import connected_to


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
    assert "down --name raytpu" in str(info.value)  # how to stop it, in the caller's terms
    assert [c.name for c in emulator.running()] == [cluster.name]
    assert not session.connected
