"""One emulated TPU cluster for all integration tests: real Ray, real JAX, no mocks.

Two v6e 4x4 slices (the main job's shape and the multi-slice runs), three v4 2x2x2 slices (two hosts
each: reservation contention), a v5p 2x2x2 (two hosts of four chips: PyTorch/XLA, one worker per
chip) and one small slice of every other generation Ray accepts, so label derivation is checked for
each: 18 TPU hosts and a head.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import ray

from raytpu_lab.cluster import emulator
from raytpu_lab.lab import Lab

CLUSTER_NAME = "raytpu-test"
SPECS = [("v6e:4x4", 2), ("v4:2x2x2", 3), ("v5litepod:2x2", 1), ("v5p:2x2x2", 1), ("v7x:2x2x1", 1)]


@pytest.fixture(scope="session")
def cluster() -> Iterator[emulator.EmulatedCluster]:
    stale = emulator.find(CLUSTER_NAME)
    if stale is not None:
        stale.down()
    # 18 hosts: generous, so a busy machine (Ray's fixed 30 s registration window) still makes it.
    c = emulator.up(SPECS, name=CLUSTER_NAME, timeout_s=420)
    try:
        yield c
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.down()


@pytest.fixture()
def lab(cluster: emulator.EmulatedCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[Lab]:
    """A connected session, installed as the kernel's Lab so magics use it; leaves nothing held."""
    import raytpu_lab.lab as lab_module

    session = Lab()
    if not ray.is_initialized():
        session.connect(cluster.address)
        expected = len(cluster.hosts) + 1
        from raytpu_lab.cluster.connect import wait_for_nodes

        assert wait_for_nodes(lambda: sum(n["Alive"] for n in ray.nodes()), expected, 90) == expected
    else:
        session.address = cluster.address
    session.cluster = cluster
    monkeypatch.setattr(lab_module, "_LAB", session)
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
