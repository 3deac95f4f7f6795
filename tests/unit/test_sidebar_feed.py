"""The sidebar's server side without Ray: the feed's revisions, the idle meter, what fits, and
one poll per interval however many clients wait (issue 15)."""

from __future__ import annotations

import asyncio
import copy
import json
import time
from typing import Any

import pytest

from raytpu_lab.jupyter.feed import KEEP_REVISIONS, ClusterFeed
from raytpu_lab.jupyter.poller import ClusterPoller
from raytpu_lab.reservations.info import list_reservations
from raytpu_lab.state.model import build_snapshot
from raytpu_lab.state.synthetic import mark_busy, synthetic_raw_state
from raytpu_lab.state.usage import IdleMeter, what_fits


def _reserve(raw: Any, name: str, slice_name: str) -> Any:
    """``raw`` plus a reservation ``raytpu:<name>`` holding every chip of ``slice_name``."""
    out = copy.deepcopy(raw)
    hosts = [n for n in out["nodes"] if n["labels"].get("ray.io/tpu-slice-name") == slice_name]
    bundles = []
    for i, n in enumerate(hosts):
        chips = n["resources_total"]["TPU"]
        n["resources_available"] = {k: v for k, v in n["resources_available"].items() if k != "TPU"}
        bundles.append({"index": i, "node_id": n["node_id"], "resources": {"TPU": chips}})
    out["placement_groups"].append({"placement_group_id": f"{name:0<28}"[:28], "name": f"raytpu:{name}",
                                    "state": "CREATED", "bundles": bundles})
    return out


BASE = synthetic_raw_state([("v4:2x2x2", 2)])


def test_a_poll_that_changes_nothing_makes_no_revision_and_a_change_sends_only_it() -> None:
    feed = ClusterFeed()
    first = feed.apply(BASE, {}, [], now=0.0)
    assert first is not None and feed.rev == 1
    assert feed.apply(BASE, {}, [], now=1.0) is None and feed.rev == 1
    held = _reserve(BASE, "r1", "tpu-v4-2x2x2-0")
    update = feed.apply(held, {}, [], now=2.0)
    assert update is not None and update["base"] == 1 and update["rev"] == 2
    assert [row[1]["name"] for row in update["slices"]] == ["tpu-v4-2x2x2-0"]  # only that row
    assert update["slices"][0][1]["holders"] == ["r1"]
    (delta,) = update["map"]
    assert delta["type"] == "delta" and {h[0] for h in delta["h"]} == {0}
    assert [r["name"] for r in update["reservations"]] == ["r1"]
    assert "geometry" not in update  # same slices, same shapes: no re-layout


def test_a_client_gets_what_it_missed_or_a_full_state_when_too_far_behind() -> None:
    feed = ClusterFeed()
    feed.apply(BASE, {}, [], now=0.0)
    assert feed.since(feed.rev) == {"type": "updates", "rev": 1, "updates": []}
    full = feed.since(-1)
    assert full["type"] == "full" and full["map"]["type"] == "full"
    assert [s["name"] for s in full["slices"]] == ["tpu-v4-2x2x2-0", "tpu-v4-2x2x2-1"]
    for i in range(3):
        feed.apply(mark_busy(BASE, 0.3, seed=i), {}, [], now=1.0 + i)
    behind = feed.since(1)
    assert behind["type"] == "updates" and [u["rev"] for u in behind["updates"]] == [2, 3, 4]
    for i in range(KEEP_REVISIONS + 2):
        feed.apply(mark_busy(BASE, 0.5, seed=100 + i) if i % 2 else BASE, {}, [], now=10.0 + i)
    assert feed.since(1)["type"] == "full"  # its revisions are gone: start over


def test_a_poll_error_is_shown_and_the_last_state_kept() -> None:
    feed = ClusterFeed()
    feed.apply(BASE, {}, [], now=0.0)
    update = feed.fail("ConnectionError: GCS unreachable")
    assert update is not None and update["error"] == "ConnectionError: GCS unreachable"
    assert feed.fail("ConnectionError: GCS unreachable") is None
    assert len(feed.full()["slices"]) == 2


def test_the_idle_meter_counts_held_and_idle_chip_hours_and_nudges_after_the_setting() -> None:
    held = _reserve(BASE, "r1", "tpu-v4-2x2x2-0")
    snap = build_snapshot(held)
    res = list_reservations(held)
    meter = IdleMeter()
    meter.observe(snap, res, [], now=0.0)
    for t in range(60, 1260, 60):  # 20 minutes, no run
        meter.observe(snap, res, [], now=float(t))
    view = meter.view(now=1200.0, idle_after_s=900.0)
    r1 = view["reservations"]["r1"]
    chips = res[0].chips
    assert chips == 8 and r1["chips"] == 8
    assert r1["held_chip_h"] == pytest.approx(8 * 1200 / 3600, abs=0.01)
    assert r1["idle_chip_h"] == r1["held_chip_h"] and r1["idle_min"] == 20 and r1["nudge"] is True
    # A run on its slice: in use, the streak ends, no nudge.
    run = [{"name": "t", "state": "running", "slices": ["tpu-v4-2x2x2-0"]}]
    meter.observe(snap, res, run, now=1260.0)
    again = meter.view(now=1260.0, idle_after_s=900.0)["reservations"]["r1"]
    assert again["nudge"] is False and again["idle_min"] == 0
    assert again["held_chip_h"] > r1["held_chip_h"] and again["idle_chip_h"] == r1["idle_chip_h"]
    assert view["total"]["held_chip_h"] == pytest.approx(r1["held_chip_h"], abs=0.01)
    # Released: gone from the meter.
    meter.observe(build_snapshot(BASE), [], [], now=1300.0)
    assert meter.view(now=1300.0)["reservations"] == {}


def test_a_gap_between_polls_counts_at_most_a_minute() -> None:
    held = _reserve(BASE, "r1", "tpu-v4-2x2x2-0")
    meter = IdleMeter()
    meter.observe(build_snapshot(held), list_reservations(held), [], now=0.0)
    meter.observe(build_snapshot(held), list_reservations(held), [], now=7200.0)
    assert meter.reservations["r1"].held_chip_h == pytest.approx(8 * 60 / 3600)


@pytest.mark.parametrize(("raw", "topology", "fits", "why"), [
    (BASE, "2x2x2", 2, ""),
    (_reserve(BASE, "r1", "tpu-v4-2x2x2-0"), "2x2x2", 1, ""),
    (_reserve(_reserve(BASE, "r1", "tpu-v4-2x2x2-0"), "r2", "tpu-v4-2x2x2-1"), "2x2x2", 0,
     "held by r1, r2"),
    (BASE, "2x2x4", 0, "no 2x2x4 slice (cluster has 2x2x2)"),
    (mark_busy(BASE, 1.0), "2x2x2", 0, "2 partly used (head locked or chips busy)"),
])
def test_what_fits_counts_reservable_slices_per_topology_and_says_why_not(
        raw: Any, topology: str, fits: int, why: str) -> None:
    rows = {r["topology"]: r for r in what_fits(build_snapshot(raw))}
    assert rows[topology]["fits"] == fits and rows[topology]["why"] == why
    assert "4x4x4" not in rows  # 64 chips: larger than the cluster's 16, not listed
    assert all(r["version"] == "v4" for r in rows.values())


class _CountingSource:
    """A poll source: one ``state`` message every ``interval_s``, counting its polls."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.polls = 0

    async def next(self) -> dict[str, Any]:
        await asyncio.sleep(self.interval_s)
        self.polls += 1
        raw = mark_busy(BASE, 0.25, seed=self.polls) if self.polls % 2 else BASE
        return {"type": "state", "raw": raw, "lifetimes": {}, "runs": []}

    async def command(self, cmd: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        return {"ok": True}

    async def close(self) -> None:
        pass


def test_five_clients_cause_one_poll_per_interval() -> None:
    interval_s, clients, duration_s = 0.1, 5, 1.2
    sources: list[_CountingSource] = []

    def make() -> _CountingSource:
        sources.append(_CountingSource(interval_s))
        return sources[-1]

    async def main() -> list[list[int]]:
        poller = ClusterPoller(make, ClusterFeed())
        end = time.monotonic() + duration_s

        async def client() -> list[int]:
            seen, rev = [], -1
            while time.monotonic() < end:
                out = await poller.wait_since(rev, 0.5)
                rev = out["rev"]
                seen.append(rev)
            return seen

        try:
            return await asyncio.gather(*(client() for _ in range(clients)))
        finally:
            await poller.close()

    seen = asyncio.run(main())
    assert len(sources) == 1, "one source for all clients"
    polls = sources[0].polls
    assert duration_s / interval_s - 3 <= polls <= duration_s / interval_s + 1, polls
    for revs in seen:  # every client followed the revisions, none polled on its own
        assert revs[-1] >= polls - 2 and revs == sorted(revs)


def test_the_wire_shapes_are_plain_json() -> None:
    feed = ClusterFeed()
    feed.apply(_reserve(BASE, "r1", "tpu-v4-2x2x2-0"), {}, [{"key": "j:t", "name": "t",
               "trainer": "jax", "state": "running", "steps": 3, "steps_per_s": 1.5,
               "slices": ["tpu-v4-2x2x2-0"], "job_id": "j", "updated_at": 5.0}], now=0.0)
    full = json.loads(json.dumps(feed.full()))
    assert full["runs"] == [{"key": "j:t", "name": "t", "trainer": "jax", "state": "running",
                             "steps": 3, "steps_per_s": 1.5, "slices": ["tpu-v4-2x2x2-0"],
                             "job_id": "j"}]
    assert full["summary"]["slices"] == 2 and full["summary"]["by_state"] == {"free": 1, "reserved": 1}
    assert full["idle"]["reservations"]["r1"]["chips"] == 8
