"""Who holds which chip: Ray's chip ids laid onto a host's counts, named on the map, the static
SVG, the snapshot's JSON and the status text (pure; the raylet's side is in
tests/integration/test_chip_holders.py)."""

from __future__ import annotations

import copy

from raytpu_lab._protocols import RawChipHolder, RawState
from raytpu_lab.state import build_snapshot
from raytpu_lab.state.chips import holder_label, place_chips
from raytpu_lab.state.synthetic import synthetic_raw_state
from raytpu_lab.widgets.svg import render_status_text, render_svg
from raytpu_lab.widgets.topology_map import TopologyMap


def _holder(chips: list[int], *, cls: str = "Holder", name: str = "", pid: int = 8090,
            actor: str = "ac" * 8, pg: str = "") -> RawChipHolder:
    return RawChipHolder(chips=chips, actor_id=actor, job_id="01000000", pid=pid,
                         class_name=cls, actor_name=name, placement_group_id=pg)


def _two_actors_on_worker_0() -> RawState:
    """A v4 2x2x2 slice whose worker 0 has two actors holding chips 0 and 1,2 (Ray's ids)."""
    raw = copy.deepcopy(synthetic_raw_state([("v4:2x2x2", 1)]))
    host = next(n for n in raw["nodes"] if n["labels"].get("ray.io/tpu-worker-id") == "0")
    host["resources_available"]["TPU"] = 1.0
    host["chip_holders"] = [_holder([0], name="a"), _holder([1, 2], pid=8091, actor="bd" * 8)]
    return raw


def test_held_chips_are_at_their_ids_and_the_rest_by_count() -> None:
    layout, labels = place_chips(4, 0, 3, [_holder([0]), _holder([1, 2], pid=2)], {}, frozenset())
    assert layout == "bbbf"
    assert labels[0].startswith("Holder (job 01000000, pid 8090)") and labels[3] == ""
    assert labels[1] == labels[2] == "Holder (job 01000000, pid 2)"
    # chip 3 held outside any bundle, two chips reserved by a bundle nobody uses yet
    assert place_chips(4, 2, 1, [_holder([3])], {}, frozenset())[0] == "rrfb"


def test_a_process_in_a_reservation_is_reserved_and_in_a_run_busy() -> None:
    owners = {"pg1": "r1", "pg2": "run digits"}
    layout, labels = place_chips(4, 4, 0, [_holder([2], pg="pg1")], owners, frozenset())
    assert layout == "rrrr" and labels[2] == "r1: Holder (job 01000000, pid 8090)"
    layout, labels = place_chips(4, 0, 4, [_holder([0, 1, 2, 3], cls="RayTrainWorker", pg="pg2")],
                                 owners, frozenset({"run digits"}))
    assert layout == "bbbb" and set(labels) == {"run digits: RayTrainWorker (job 01000000, pid 8090)"}


def test_ray_counts_win_over_a_holder_seen_before_its_chips_were_counted() -> None:
    layout, labels = place_chips(4, 0, 0, [_holder([1])], {}, frozenset())
    assert layout == "ffff" and labels[1]  # still named, drawn free as Ray counts it
    assert place_chips(4, 0, 1, [_holder([7])], {}, frozenset()) == ("", ())  # no such chip


def test_names_say_actor_name_task_and_job() -> None:
    assert holder_label(_holder([0], name="a"), {}) == "Holder 'a' (job 01000000, pid 8090)"
    task = RawChipHolder(chips=[0], actor_id="", job_id="02000000", pid=7, class_name="",
                         actor_name="", placement_group_id="")
    assert holder_label(task, {}) == "task (job 02000000, pid 7)"


def test_snapshot_map_svg_and_status_name_each_chips_holder() -> None:
    snap = build_snapshot(_two_actors_on_worker_0())
    host = snap.slices[0].hosts[0]
    assert host.chip_layout == "bbbf" and host.chip_states() == ["busy", "busy", "busy", "free"]
    a, b = "Holder 'a' (job 01000000, pid 8090)", "Holder (job 01000000, pid 8091)"
    assert host.chip_holders == (a, b, b, "")
    assert host.to_dict()["chip_holders"] == [a, b, b, ""]

    svg = render_svg(snap)
    assert f'data-holder="{a.replace(chr(39), "&#x27;")}" stroke="#202124" stroke-width="2"><title>chip 0: ' in svg
    assert svg.count("<title>chip 1: ") == 1 and svg.count("<title>chip 2: ") == 1

    text = render_status_text(snap)
    assert f"w0 chip 0: {a}" in text and f"w0 chips 1,2: {b}" in text

    row = TopologyMap(snap)._full_message()["hosts"][0][0]
    assert row[5] == "bbbf" and row[6] == [a, b, b, ""]


def test_without_holders_nothing_changes() -> None:
    raw = synthetic_raw_state([("v4:2x2x2", 1)])
    snap = build_snapshot(raw)
    host = snap.slices[0].hosts[0]
    assert (host.chip_layout, host.chip_holders) == ("", ())
    assert "chips held" not in render_status_text(snap) and "data-holder" not in render_svg(snap)
