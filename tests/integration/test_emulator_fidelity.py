"""The emulator behaves like a real slice where programs notice (real Ray, real JAX, no mocks).

One module cluster: a v4 2x2x2 slice (2 hosts of 4 chips, 8 devices). Other clusters are started
by the tests that need them (a second one for the Jobs API, one under busy loops, one whose head
is killed), all small.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raytpu_lab import _ray_private
from raytpu_lab.cluster import _process_groups, emulator
from raytpu_lab.errors import EmulatorError

NAME = "rt-fid"


def _leftovers(folder: Path) -> list[str]:
    """Processes still running for an emulated cluster's folder (by command line or env)."""
    left = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.pid == os.getpid() or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(proc.info["cmdline"] or [])
            if f"{folder}/" in cmd or _process_groups.in_cluster(proc.pid, str(folder)):
                left.append(f"{proc.pid}: {cmd[:120]}")
        except psutil.Error:
            continue
    return left


def _nothing_left(folder: Path, timeout_s: float = 10.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while (left := _leftovers(folder)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@pytest.fixture(scope="module")
def cluster() -> Iterator[emulator.EmulatedCluster]:
    if ray.is_initialized():
        ray.shutdown()
    stale = emulator.find(NAME)
    if stale is not None:
        stale.down()
    c = emulator.up([("v4:2x2x2", 1)], name=NAME, timeout_s=600)
    try:
        _ray_private.enable_token_auth()
        ray.init(address=c.address, logging_level="ERROR", log_to_driver=False)
        yield c
    finally:
        ray.shutdown()
        c.down()


def _host_nodes() -> dict[int, dict]:
    return {int(n["Labels"]["ray.io/tpu-worker-id"]): n for n in ray.nodes()
            if n["Alive"] and "ray.io/tpu-worker-id" in n["Labels"]}


def _on(node: dict) -> NodeAffinitySchedulingStrategy:
    return NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)


@pytest.mark.slow
def test_every_host_has_its_own_address(cluster: emulator.EmulatedCluster) -> None:
    nodes = _host_nodes()
    assert sorted(nodes) == [0, 1]
    ips = [nodes[w]["NodeManagerAddress"] for w in (0, 1)]
    assert ips == [h.ip for h in cluster.hosts]
    assert len(set(ips)) == 2 and all(ip.startswith("127.") and ip != "127.0.0.1" for ip in ips)


@pytest.mark.slow
def test_a_task_holding_a_hosts_chips_sees_the_slice_and_barriers_wait(
        cluster: emulator.EmulatedCluster) -> None:
    @ray.remote(resources={"TPU": 4}, max_calls=1)
    def step(delay_s: float) -> tuple[int, int, int, float]:
        import jax
        from jax.experimental import multihost_utils

        count = jax.device_count()
        time.sleep(delay_s)
        start = time.monotonic()
        multihost_utils.sync_global_devices("raytpu-test-barrier")
        return count, jax.local_device_count(), jax.process_index(), time.monotonic() - start

    nodes = _host_nodes()
    # Host 1 reaches the barrier 8 s after host 0: host 0 must wait there for it.
    first = step.options(scheduling_strategy=_on(nodes[0])).remote(0.0)
    second = step.options(scheduling_strategy=_on(nodes[1])).remote(8.0)
    (count0, local0, index0, waited0), (count1, local1, index1, _) = ray.get([first, second],
                                                                              timeout=240)
    assert (count0, count1) == (8, 8)
    assert (local0, local1) == (4, 4)
    assert (index0, index1) == (0, 1)
    assert waited0 > 5.0, waited0


@pytest.mark.slow
def test_kuberays_first_tpu_example_prints_the_slices_devices(
        cluster: emulator.EmulatedCluster) -> None:
    # The shape of KubeRay's tpu_list_devices.py (the RayJob sample's entrypoint): one task per
    # TPU host, each syncing across hosts and returning jax.device_count().
    @ray.remote(resources={"TPU": 4}, max_calls=1)
    def tpu_cores() -> str:
        import jax
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("sync")
        return "TPU cores:" + str(jax.device_count())

    workers = int(ray.cluster_resources()["TPU"]) // 4
    assert ray.get([tpu_cores.remote() for _ in range(workers)], timeout=240) == ["TPU cores:8"] * 2


@pytest.mark.slow
def test_a_process_without_the_chips_sees_only_its_own_devices(
        cluster: emulator.EmulatedCluster) -> None:
    @ray.remote(num_cpus=1, max_calls=1)
    def plain() -> int:
        import jax

        return jax.device_count()

    assert ray.get(plain.options(scheduling_strategy=_on(_host_nodes()[1])).remote(),
                   timeout=120) == 4


@pytest.mark.slow
def test_ray_train_gives_every_host_local_rank_0_and_its_own_node_rank(
        cluster: emulator.EmulatedCluster, tmp_path: Path) -> None:
    from ray.train.v2.api.config import RunConfig, ScalingConfig
    from ray.train.v2.jax import JaxTrainer

    out = tmp_path / "ranks"
    out.mkdir()

    def loop(config: dict) -> None:
        import jax
        import ray.train

        ctx = ray.train.get_context()
        Path(config["out"], str(ctx.get_world_rank())).write_text(
            f"{ctx.get_local_rank()} {ctx.get_local_world_size()} {ctx.get_node_rank()} "
            f"{jax.device_count()}")

    trainer = JaxTrainer(
        loop, train_loop_config={"out": str(out)},
        scaling_config=ScalingConfig(use_tpu=True, num_workers=2, topology="2x2x2",
                                     accelerator_type="TPU-V4"),
        run_config=RunConfig(storage_path=str(tmp_path / "storage"), name="ranks"))
    # Ray Train's fit() in the main thread installs a SIGINT handler bound to its controller and
    # leaves it installed; a later Ctrl-C (another test's interrupt) would reach the dead one.
    previous = signal.getsignal(signal.SIGINT)
    try:
        trainer.fit()
    finally:
        signal.signal(signal.SIGINT, previous)
    rows = sorted(p.read_text().split() for p in out.iterdir())
    assert len(rows) == 2
    assert [r[:2] for r in rows] == [["0", "1"], ["0", "1"]]  # local rank 0 of 1 on each host
    assert sorted(r[2] for r in rows) == ["0", "1"]  # distinct node ranks
    assert {r[3] for r in rows} == {"8"}


@pytest.mark.slow
def test_jax_distributed_initialize_in_a_per_host_cell_is_accepted(
        cluster: emulator.EmulatedCluster) -> None:
    from raytpu_lab.lab import Lab

    lab = Lab()
    lab.address = cluster.address
    lab.cluster = cluster
    lab.reserve("2x2x2", "v4", name="fid1", timeout_s=120)
    try:
        result = lab.run_on("fid1", "import jax\njax.distributed.initialize()\n"
                                    "jax.distributed.initialize()\n"
                                    "(jax.process_index(), jax.device_count())")
        assert result.values == [(0, 8), (1, 8)]
    finally:
        lab.release("fid1")


def _submit(cluster: emulator.EmulatedCluster) -> subprocess.CompletedProcess[str]:
    ray_cli = str(Path(sys.executable).with_name("ray"))
    return subprocess.run(
        [ray_cli, "job", "submit", "--address", cluster.dashboard_url, "--",
         "python", "-c", "print('job ran on', __import__('os').environ.get('RAY_CLUSTER_NAME'))"],
        env={**os.environ, **emulator.AUTH_ENV}, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_two_clusters_at_once_both_accept_ray_job_submit(cluster: emulator.EmulatedCluster) -> None:
    other = emulator.up([("v5litepod:2x2", 1)], name="rt-fid2", timeout_s=600)
    try:
        for target in (cluster, other):
            done = _submit(target)
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
            assert f"job ran on {target.name}" in done.stdout, done.stdout[-2000:]
            assert "succeeded" in done.stdout, done.stdout[-2000:]
    finally:
        other.down()
    assert _nothing_left(other.folder) == []


def test_a_start_with_busy_loops_running_succeeds() -> None:
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(4)]
    try:
        c = emulator.up([("v4:2x2x2", 1)], name="rt-busy", timeout_s=600)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    try:
        assert len(c.hosts) == 2 and c.is_running()
    finally:
        c.down()
    assert _nothing_left(c.folder) == []


@pytest.mark.slow
def test_a_head_killed_during_start_is_reported_at_once_with_its_cause() -> None:
    folder = emulator.state_root() / "rt-kill"
    outcome: dict[str, object] = {}

    def start() -> None:
        try:
            outcome["cluster"] = emulator.up([("v4:2x2x2", 1)], name="rt-kill", timeout_s=600)
        except EmulatorError as err:
            outcome["error"] = err
        outcome["at"] = time.monotonic()

    thread = threading.Thread(target=start)
    thread.start()
    # Once the first host starts, the head is up: kill all of its processes.
    deadline = time.monotonic() + 600
    while not list((folder / "logs").glob("tpu-*.log")) and time.monotonic() < deadline \
            and thread.is_alive():
        time.sleep(0.1)
    head_pgid = next((p.pid for p in psutil.process_iter(["cmdline"])
                      if any("gcs_server" in c for c in p.info["cmdline"] or [])
                      and f"{folder}/" in " ".join(p.info["cmdline"] or [])), None)
    assert head_pgid is not None, outcome
    os.killpg(os.getpgid(head_pgid), signal.SIGKILL)
    killed_at = time.monotonic()
    thread.join(120)
    assert not thread.is_alive()
    error = outcome.get("error")
    if error is None:  # retried with a fresh head instead: acceptable, and it must work
        c = outcome["cluster"]
        assert isinstance(c, emulator.EmulatedCluster) and c.is_running()
        c.down()
    else:
        assert float(outcome["at"]) - killed_at < 15.0  # type: ignore[arg-type]
        assert "head" in str(error) and "died" in str(error), str(error)
        assert "Last lines" in str(error)
    assert _nothing_left(folder) == []


@pytest.mark.slow
def test_down_leaves_nothing_after_a_killed_driver(cluster: emulator.EmulatedCluster) -> None:
    driver = subprocess.Popen(
        [sys.executable, "-c",
         "import ray, time\n"
         f"ray.init(address={cluster.address!r})\n"
         "@ray.remote(resources={'TPU': 4})\n"
         "def hold():\n    time.sleep(600)\n"
         "refs = [hold.remote() for _ in range(2)]\nprint('held', flush=True)\ntime.sleep(600)\n"],
        env={**os.environ, **emulator.AUTH_ENV}, stdout=subprocess.PIPE, text=True)
    assert driver.stdout is not None
    assert driver.stdout.readline().strip() == "held"
    time.sleep(3.0)  # the tasks' workers start on the hosts
    driver.kill()
    driver.wait()
    ray.shutdown()
    cluster.down()
    assert _nothing_left(cluster.folder) == []
    assert not cluster.folder.exists()
