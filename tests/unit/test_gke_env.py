"""The per-host environment the emulator gives Ray: what GKE, KubeRay and the TPU webhook set."""

from __future__ import annotations

import pytest

from raytpu_lab.cluster.gke_env import (
    emulated_jax_environment,
    group_name,
    head_environment,
    tpu_host_environment,
)
from raytpu_lab.tpu.topology import parse_spec


@pytest.mark.parametrize(("spec", "accel_env", "hosts", "chips", "devices"), [
    ("v6e:4x4", "v6e-16", 4, 4, 4),
    ("v6e:2x4", "v6e-8", 1, 8, 8),
    ("v5e:2x2", "v5litepod-4", 1, 4, 4),
    ("v4:2x2x2", "v4-16", 2, 4, 4),
    ("v5p:2x2x4", "v5p-32", 4, 4, 4),
    ("v7x:2x2x1", "tpu7x-8", 1, 4, 8),
])
def test_every_host_gets_the_gke_tpu_environment(spec, accel_env, hosts, chips, devices) -> None:
    shape = parse_spec(spec)
    assert shape.num_hosts == hosts
    for worker in range(hosts):
        env = tpu_host_environment(shape, cluster="c", replica=1, worker_id=worker,
                                   head_host="127.0.0.1", gcs_port=6379)
        assert env["TPU_ACCELERATOR_TYPE"] == accel_env
        assert env["TPU_TOPOLOGY"] == shape.topology
        assert env["TPU_WORKER_ID"] == str(worker)
        assert env["TPU_NAME"] == f"{group_name(shape)}-1"
        assert env["TPU_SKIP_MDS_QUERY"] == "true"
        assert env["RAY_NODE_TYPE_NAME"] == group_name(shape)
        assert env["RAY_ADDRESS"] == "127.0.0.1:6379"
        assert len(env["TPU_RUNTIME_METRICS_PORTS"].split(",")) == chips
        hostnames = env["TPU_WORKER_HOSTNAMES"].split(",")
        assert len(hostnames) == hosts
        if hosts > 1:
            assert hostnames[worker] == f"{group_name(shape)}-1-{worker}.c-headless"
        # Ray must derive labels and head resources itself: we never set them.
        assert not [k for k in env if k.startswith("ray.io")]
    jax_env = emulated_jax_environment(shape)
    assert jax_env == {"JAX_PLATFORMS": "cpu",
                       "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}


def test_worker_id_outside_the_slice_is_refused() -> None:
    with pytest.raises(ValueError, match="worker_id 4"):
        tpu_host_environment(parse_spec("v6e:4x4"), cluster="c", replica=0, worker_id=4,
                             head_host="h", gcs_port=1)


def test_head_has_kuberay_head_address() -> None:
    env = head_environment(cluster="c", gcs_port=1234)
    assert env["RAY_ADDRESS"] == "127.0.0.1:1234"
    assert not [k for k in env if k.startswith("TPU_")]
