"""The cluster read over Ray Client (``ray://``), as ``connect --kuberay`` connects from outside.

Runs late (it drops the session's direct connection; the ``lab`` fixture reconnects afterwards).
"""

from __future__ import annotations

import pytest
import ray

from raytpu_lab.cluster import emulator
from raytpu_lab.lab import Lab

pytestmark = pytest.mark.slow


def test_status_works_over_ray_client(cluster: emulator.EmulatedCluster) -> None:
    assert cluster.client_port
    ray.shutdown()
    session = Lab()
    try:
        session.connect(f"ray://127.0.0.1:{cluster.client_port}", timeout_s=30)
        assert ray.util.client.ray.is_connected()
        snap = session.snapshot()
        assert [s.name for s in snap.slices_of("v6e-16")] == ["tpu-v6e-4x4-0", "tpu-v6e-4x4-1"]
        assert all(s.idle for s in snap.slices_of("v6e-16"))
        assert "tpu-v6e-4x4-0" in repr(session.status())
    finally:
        ray.shutdown()
