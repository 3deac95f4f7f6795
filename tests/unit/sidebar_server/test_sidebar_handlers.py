"""The sidebar's handlers in jupyter_server's test server (pytest-jupyter), on a fake poll source:
auth, XSRF, JSON 4xx errors, release/stop routed to the poller (issue 15). No Ray."""

from __future__ import annotations

import json
from typing import Any

import pytest
import tornado.httpclient

from raytpu_lab.jupyter import handlers
from raytpu_lab.jupyter.clusters import ClusterRef
from raytpu_lab.state.synthetic import synthetic_raw_state

RAW = synthetic_raw_state([("v4:2x2x2", 2)])
RAW["placement_groups"] = [{"placement_group_id": "ab" * 14, "name": "raytpu:r1", "state": "CREATED",
                            "bundles": [{"index": 0, "node_id": RAW["nodes"][1]["node_id"],
                                         "resources": {"TPU": 4.0}}]}]
RUN = {"key": "01000000:t1", "name": "t1", "trainer": "jax", "state": "running", "steps": 1,
       "steps_per_s": 0.5, "slices": [], "job_id": "01000000", "updated_at": 1e12}


class FakeSource:
    commands: list[dict[str, Any]] = []

    def __init__(self, target: str, interval_s: float) -> None:
        self.sent = False

    async def next(self) -> dict[str, Any]:
        import asyncio

        if self.sent:
            await asyncio.sleep(0.05)
        self.sent = True
        return {"type": "state", "raw": RAW, "lifetimes": {}, "runs": [RUN]}

    async def command(self, cmd: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        FakeSource.commands.append(cmd)
        return {"ok": True}

    async def close(self) -> None:
        pass


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {"ServerApp": {"jpserver_extensions": {"raytpu_lab.jupyter": True}}}


@pytest.fixture(autouse=True)
def fake_cluster(monkeypatch: pytest.MonkeyPatch, jp_serverapp: Any, jp_asyncio_loop: Any) -> Any:
    monkeypatch.setattr(handlers, "SubprocessSource", FakeSource)
    monkeypatch.setattr(handlers.SidebarState, "clusters", lambda self: [
        ClusterRef(id="emulated-x", kind="emulated", label="x", target="127.0.0.1:1", name="x")])
    FakeSource.commands = []
    yield
    jp_asyncio_loop.run_until_complete(jp_serverapp.web_app.settings["raytpu_sidebar"].close())


async def _json(jp_fetch: Any, *path: str, **kw: Any) -> Any:
    return json.loads((await jp_fetch("raytpu", "api", *path, **kw)).body)


async def test_snapshot_release_and_stop_go_through_the_one_poller(jp_fetch: Any) -> None:
    listed = await _json(jp_fetch, "clusters")
    assert listed == {"clusters": [{"id": "emulated-x", "kind": "emulated", "label": "x",
                                    "target": "127.0.0.1:1", "name": "x"}]}
    full = await _json(jp_fetch, "clusters", "emulated-x", "snapshot")
    assert full["type"] == "full" and [r["name"] for r in full["reservations"]] == ["r1"]
    assert await _json(jp_fetch, "clusters", "emulated-x", "reservations", "r1", "release",
                       method="POST", body="{}") == {"released": "r1"}
    assert await _json(jp_fetch, "clusters", "emulated-x", "runs", "01000000%3At1", "stop",
                       method="POST", body="{}") == {"stopping": "01000000:t1"}
    assert FakeSource.commands == [{"op": "release", "name": "r1"},
                                   {"op": "stop", "key": "01000000:t1"}]
    details = await _json(jp_fetch, "clusters", "emulated-x", "details",
                          params={"slice": "tpu-v4-2x2x2-0", "worker": "0"})
    assert details["type"] == "details" and details["node_id"] == RAW["nodes"][1]["node_id"]


@pytest.mark.parametrize(("path", "method", "code", "says"), [
    (("clusters", "nope", "snapshot"), "GET", 404, "no cluster 'nope'"),
    (("clusters", "nope", "updates"), "GET", 404, "known: ['emulated-x']"),
    (("clusters", "emulated-x", "reservations", "r9", "release"), "POST", 404,
     "no reservation named 'r9' on cluster 'emulated-x'; reservations: ['r1']"),
    (("clusters", "emulated-x", "runs", "j%3Anope", "stop"), "POST", 404, "no run 'j:nope'"),
    (("clusters", "emulated-x", "updates?since=x"), "GET", 400, "since must be an integer"),
    (("clusters", "address"), "DELETE", 404, "no cluster 'address'"),
])
async def test_bad_ids_give_a_json_4xx_that_says_what_is_known(
        jp_fetch: Any, path: tuple[str, ...], method: str, code: int, says: str) -> None:
    kw: dict[str, Any] = {"method": method}
    if method == "POST":
        kw["body"] = "{}"
    *head, last = path
    if "?" in last:
        last, _, query = last.partition("?")
        kw["params"] = dict([query.split("=")])
    with pytest.raises(tornado.httpclient.HTTPClientError) as err:
        await jp_fetch("raytpu", "api", *head, last, **kw)
    assert err.value.code == code
    body = json.loads(err.value.response.body)
    assert says in body["message"], body
    assert FakeSource.commands == []


async def test_requests_without_the_token_or_xsrf_are_refused(
        jp_fetch: Any, jp_http_port: int, jp_base_url: str, jp_auth_header: dict[str, str]) -> None:
    client = tornado.httpclient.AsyncHTTPClient()
    url = f"http://localhost:{jp_http_port}{jp_base_url}raytpu/api/clusters"
    anon = await client.fetch(url, raise_error=False)
    assert anon.code == 403
    post = await client.fetch(f"{url}/emulated-x/reservations/r1/release", method="POST",
                              body="{}", raise_error=False)
    assert post.code == 403
    assert FakeSource.commands == []
