"""The integration tests' view of the session's shared emulated TPU cluster (tests/conftest.py):
real Ray, real JAX, no mocks. Its slices: :data:`tests.conftest.SHARED_SPECS`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import ray

from raytpu_lab.cluster import emulator
from raytpu_lab.lab import Lab

from ..conftest import SHARED_SPECS as SPECS

__all__ = ["SPECS", "connected_to", "live_actors", "live_placement_groups", "wait_until"]


@pytest.fixture(scope="session")
def cluster(shared_cluster: emulator.EmulatedCluster) -> emulator.EmulatedCluster:
    return shared_cluster


def connected_to(cluster: emulator.EmulatedCluster) -> bool:
    """Whether this process's Ray driver is connected to ``cluster``. By GCS port: Ray reports
    the head's address as the machine's own IP (it resolves ``127.0.0.1``), and every emulated
    cluster on this machine has a port of its own."""
    if not ray.is_initialized():
        return False
    return ray.get_runtime_context().gcs_address.rsplit(":", 1)[1] == cluster.address.rsplit(":", 1)[1]


@pytest.fixture()
def lab(cluster: emulator.EmulatedCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    """A connected session, installed as the kernel's Lab so magics use it; leaves nothing held."""
    from raytpu_lab.lab import use_session

    session = Lab()
    if ray.is_initialized() and not connected_to(cluster):
        ray.shutdown()  # another module's own cluster: one driver talks to one cluster at a time
    if not ray.is_initialized():
        session.connect(cluster.address)
        expected = len(cluster.hosts) + 1
        from raytpu_lab.cluster.connect import wait_for_nodes

        assert wait_for_nodes(lambda: sum(n["Alive"] for n in ray.nodes()), expected, 90) == expected
    else:
        session.address = cluster.address
    session.cluster = cluster
    with use_session(session):
        yield session
    for res in session.reservations():
        res.release()


def wait_until(predicate, timeout_s: float = 10.0) -> bool:
    """Poll ``predicate`` every 50 ms until it is true or ``timeout_s`` seconds pass."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


def live_placement_groups() -> list[dict]:
    return [pg for pg in ray.util.placement_group_table().values() if pg["state"] != "REMOVED"]


def live_actors() -> list[str]:
    """Live actors, less Ray's own process-wide singletons (class names starting with "_", e.g.
    Ray Data's ``_AutoscalingCoordinatorActor``, which Ray keeps for the driver's lifetime)."""
    from ray.util.state import list_actors

    # An explicit address: other local clusters may run on this machine at the same time.
    address = ray.get_runtime_context().gcs_address
    return [a.class_name for a in list_actors(address=address, filters=[("state", "=", "ALIVE")])
            if not a.class_name.startswith("_")]


def host_processes() -> int:
    """Live per-host processes (``_HostProcess`` actors) of this driver's cluster."""
    from ray.util.state import list_actors

    address = ray.get_runtime_context().gcs_address
    return len(list_actors(address=address, filters=[("state", "=", "ALIVE"),
                                                     ("class_name", "=", "_HostProcess")]))
