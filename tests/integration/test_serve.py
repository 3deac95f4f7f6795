"""Ray Serve deployments on reserved slices, on the emulator with real Ray Serve (no mocks).

One module cluster: two single-host v4 2x2x1 slices and one two-host v4 2x2x2 slice. Replicas
land only on the reserved slice's hosts (node labels), a concurrent reserve never gets the
serving slice, a 2-host replica runs code on both hosts, delete/release leave no Serve app,
actor or placement group behind, and the pre-deploy checks refuse with the numbers.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import IPython
import pytest
import ray
from IPython.testing.globalipapp import start_ipython
from IPython.utils.capture import capture_output

from raytpu_lab.cluster import emulator
from raytpu_lab.errors import NoSliceAvailableError, ServeError
from raytpu_lab.lab import Lab, use_session

from .conftest import connected_to, live_actors, live_placement_groups, wait_until

pytestmark = pytest.mark.slow

NAME = "rt-serve"


@pytest.fixture(scope="module")
def serve_cluster() -> Iterator[emulator.EmulatedCluster]:
    if ray.is_initialized():
        ray.shutdown()
    stale = emulator.find(NAME)
    if stale is not None:
        stale.down()
    c = emulator.up([("v4:2x2x1", 2), ("v4:2x2x2", 1)], name=NAME, timeout_s=600)
    try:
        yield c
    finally:
        ray.shutdown()
        c.down()


@pytest.fixture()
def lab(serve_cluster: emulator.EmulatedCluster) -> Iterator[Lab]:
    session = Lab()
    if ray.is_initialized() and not connected_to(serve_cluster):
        ray.shutdown()
    if not ray.is_initialized():
        session.connect(serve_cluster.address)
    else:
        session.address = serve_cluster.address
    session.cluster = serve_cluster
    with use_session(session):
        yield session
    for app in list(session.serving.apps):
        session.serve_delete(app)
    for res in session.reservations():
        res.release()


def _ours() -> list[str]:
    return [a for a in live_actors() if a.startswith(("Serve", "ProxyActor", "_HostProcess"))]


def _left() -> tuple[list[str], list[str]]:
    """Our actors and the live placement groups, sorted: the state API lists them in no set order."""
    return sorted(_ours()), sorted(g["name"] for g in live_placement_groups())


WHERE = '''
class Where:
    def __init__(self):
        from raytpu_lab.serve import replica_hosts
        self.hosts = replica_hosts()

    def __call__(self, request):
        import ray
        def where():
            labels = ray.get_runtime_context().get_node_labels()
            return [labels["ray.io/tpu-slice-name"], labels["ray.io/tpu-worker-id"]]
        return self.hosts.run(where)
'''


def _class(code: str, name: str) -> type:
    ns: dict = {}
    exec(compile(code, "<cell>", "exec"), ns)  # noqa: S102 (the test's own class)
    return ns[name]


def _get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=30) as resp:  # noqa: S310 (127.0.0.1)
        return json.loads(resp.read())


def test_single_host_replica_stays_on_its_slice_and_no_reserve_gets_it(lab: Lab) -> None:
    res = lab.reserve("2x2x1", "v4", name="one", timeout_s=30)
    served = lab.serve("one", _class(WHERE, "Where"), app="where")
    assert served.url.startswith("http://127.0.0.1:")
    assert _get(served.url) == [[res.slice_names[0], "0"]]
    assert served.replica_hosts == [f"{res.slice_names[0]} worker 0"]
    status = lab.serve_status("where")
    assert status["status"] == "RUNNING" and status["deployments"]["Where"]["running"] == 1
    # The serving slice keeps its head lock: a concurrent reserve gets the other slice, then none.
    other = lab.reserve("2x2x1", "v4", name="other", timeout_s=10)
    assert other.slice_names != res.slice_names
    with pytest.raises(NoSliceAvailableError):
        lab.reserve("2x2x1", "v4", name="third", timeout_s=3)
    assert lab.snapshot().slice(res.slice_names[0]).owners == ["serve: where"]
    lab.serve_delete("where")
    assert res.handle is not None and res.lent_to == ""  # the chips are the reservation's again
    assert wait_until(lambda: not _ours(), 30), _ours()
    assert sorted(g["name"] for g in live_placement_groups()) == sorted(
        ["raytpu:one", f"raytpu:one:head:{res.slice_names[0]}",
         "raytpu:other", f"raytpu:other:head:{other.slice_names[0]}"])
    assert lab.run_on("one", "1 + 1").values == [2]  # the reservation is usable again


def test_two_host_replica_runs_on_both_hosts_and_release_leaves_nothing(lab: Lab) -> None:
    res = lab.reserve("2x2x2", "v4", name="two", timeout_s=30)
    served = lab.serve("two", _class(WHERE, "Where"), app="where2")
    assert _get(served.url) == [[res.slice_names[0], "0"], [res.slice_names[0], "1"]]
    lab.release("two")
    assert not lab.serving.apps
    assert wait_until(lambda: _left() == ([], []), 30), _left()


def test_checks_refuse_before_anything_starts(lab: Lab) -> None:
    res = lab.reserve("2x2x2", "v4", name="chk", timeout_s=30)
    before = _left()
    cls = _class(WHERE, "Where")
    with pytest.raises(ServeError, match="2 replicas need 2 slices"):
        lab.serve("chk", cls, replicas=2)
    with pytest.raises(ServeError, match=r"tensor_parallel_size=4 .*8 chips each"):
        lab.serve("chk", cls, init_kwargs={"config": {"tensor_parallel_size": 4}})
    from ray import serve

    with pytest.raises(ServeError, match="asks for 8 TPU chips on one host; a host has 4"):
        lab.serve("chk", serve.deployment(ray_actor_options={"resources": {"TPU": 8}})(cls))
    assert _left() == before and res.handle is not None and not lab.serving.apps


def test_init_that_raises_shows_the_host_and_traceback_and_frees_everything(lab: Lab) -> None:
    res = lab.reserve("2x2x1", "v4", name="bad", timeout_s=30)
    broken = _class("class Broken:\n    def __init__(self):\n"
                    "        raise ValueError('no weights here')\n"
                    "    def __call__(self, request):\n        return 1\n", "Broken")
    with pytest.raises(ServeError) as info:
        lab.serve("bad", broken, app="broken", timeout_s=90)
    err = info.value
    assert err.host == f"{res.slice_names[0]} worker 0"
    assert "ValueError: no weights here" in err.traceback
    assert not lab.serving.apps and res.handle is not None
    assert wait_until(lambda: not _ours(), 30), _ours()


def test_the_magics_serve_show_status_and_delete(lab: Lab) -> None:
    ip = start_ipython() or IPython.get_ipython()
    ip.run_line_magic("load_ext", "raytpu_lab")
    lab.reserve("2x2x1", "v4", name="mg", timeout_s=30)
    with capture_output() as out:
        result = ip.run_cell("%%raytpu serve --on mg --app hello --route /hi\n"
                             "class Hello:\n    def __call__(self, request):\n        return 'hi'\n",
                             store_history=False)
    assert result.error_in_exec is None, out.stdout + out.stderr
    assert "Serving 'hello' at http://127.0.0.1:" in out.stdout and "/hi on tpu-v4-2x2x1-" in out.stdout
    with capture_output() as out:
        ip.run_cell("%raytpu serve status hello", store_history=False)
    assert "hello: RUNNING" in out.stdout and "replicas 1/1 running" in out.stdout
    # A bounded load stops at its duration and reports what it sent; the panel is a small bundle.
    with capture_output() as out:
        result = ip.run_cell("%raytpu serve load hello --rps 20 --duration 2 --concurrency 4",
                             store_history=False)
    assert result.error_in_exec is None, out.stdout + out.stderr
    summary = ip.user_ns["last_load"].summary()
    assert summary["sent"] == 40 and summary["errors"] == 0 and summary["elapsed_s"] < 4
    final = out.outputs[-1].data
    assert "<script" not in final["text/html"] and "40 sent, 40 ok" in final["text/plain"]
    assert "replicas running/target" in final["text/html"]
    with capture_output() as out:
        ip.run_cell("%raytpu serve delete hello", store_history=False)
    assert "Deleted app 'hello'" in out.stdout and not lab.serving.apps


def test_a_slice_a_replica_reserves_itself_is_attributed_to_its_app(lab: Lab) -> None:
    """As Ray Serve LLM does on TPUs (``ray/llm/_internal/serve/core/configs/accelerators.py``):
    a replica, deployed with plain ``serve.run`` by someone else, reserves its own slice with
    ``ray.util.tpu.slice_placement_group``; the map names the app and deployment holding it."""
    import socket

    from ray import serve

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    class SliceHolder:
        def __init__(self) -> None:
            import ray as ray_
            from ray.util.tpu import slice_placement_group

            self.slice = slice_placement_group(topology="2x2x1", accelerator_version="v4")
            ray_.get(self.slice.placement_group.ready(), timeout=60)

        def __call__(self, request: object) -> str:
            return "ok"

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    owner = "serve: selfmade/SliceHolder"

    def held() -> list[str]:
        return [s.name for s in lab.snapshot().slices if owner in s.owners]

    serve.run(SliceHolder.bind(), name="selfmade", route_prefix=None)
    try:
        assert wait_until(lambda: len(held()) == 1, 30), [
            (s.name, s.owners) for s in lab.snapshot().slices]
        # Which v4 slice (or host of one) the replica gets is Ray's choice, not ours.
        assert held()[0].startswith("tpu-v4-"), held()
    finally:
        serve.delete("selfmade")
    assert wait_until(lambda: not held(), 30), held()  # the replica's groups went with it
