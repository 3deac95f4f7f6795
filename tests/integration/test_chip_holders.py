"""Who holds which chip, on the emulated cluster: Ray's own chip assignment (the ids it puts in each
worker's TPU_VISIBLE_CHIPS) is what the map, the static SVG and ``status`` show, chip by chip."""

from __future__ import annotations

import os

import pytest
import ray
from ray.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

from raytpu_lab.lab import Lab
from raytpu_lab.widgets.svg import render_status_text, render_svg

from .conftest import wait_until


@ray.remote(num_cpus=0)
class Holder:
    def visible_chips(self) -> list[int]:
        return [int(c) for c in os.environ["TPU_VISIBLE_CHIPS"].split(",")]


def _free_v4_host(lab: Lab):
    for s in lab.snapshot().slices_of("v4-16"):
        for h in s.hosts:
            if h.state == "free" and h.chips == 4:
                return s.name, h
    pytest.fail("no free v4 host on the shared cluster")


def test_two_actors_chips_are_named_at_rays_chip_ids(lab: Lab) -> None:
    slice_name, host = _free_v4_host(lab)
    on_host = NodeAffinitySchedulingStrategy(host.node_id, soft=False)
    one = Holder.options(resources={"TPU": 1}, scheduling_strategy=on_host, name="chip-one").remote()
    two = Holder.options(resources={"TPU": 2}, scheduling_strategy=on_host).remote()
    try:
        ids_one, ids_two = ray.get([one.visible_chips.remote(), two.visible_chips.remote()], timeout=60)
        assert sorted(ids_one + ids_two) == sorted(set(ids_one + ids_two)) and len(ids_two) == 2

        def seen():
            return lab.snapshot().slice(slice_name).hosts[host.worker_id]

        assert wait_until(lambda: sum(map(bool, seen().chip_holders)) == 3, 15), seen()
        now = seen()
        for chip in ids_one:
            assert now.chip_holders[chip].startswith("Holder 'chip-one' (job "), now.chip_holders
            assert now.chip_states()[chip] == "busy"
        for chip in ids_two:
            assert now.chip_holders[chip].startswith("Holder (job "), now.chip_holders
        (free_chip,) = set(range(4)) - set(ids_one) - set(ids_two)
        assert now.chip_holders[free_chip] == "" and now.chip_states()[free_chip] == "free"

        snap = lab.snapshot()
        text = render_status_text(snap)
        assert f"{slice_name} w{host.worker_id} chip {ids_one[0]}: Holder 'chip-one'" in text, text
        assert f"chips {','.join(map(str, ids_two))}: Holder (job" in text, text
        assert render_svg(snap).count(f"<title>chip {ids_two[0]}: Holder (job") == 1
    finally:
        for actor in (one, two):
            ray.kill(actor)
    assert wait_until(lambda: not any(lab.snapshot().slice(slice_name).hosts[host.worker_id]
                                      .chip_holders), 15)


def test_an_actor_in_a_reservation_is_named_with_it(lab: Lab) -> None:
    res = lab.reserve("2x2x2", "v4", name="chipres")
    actor = Holder.options(resources={"TPU": 1}, scheduling_strategy=PlacementGroupSchedulingStrategy(
        res.placement_group, placement_group_bundle_index=0)).remote()
    try:
        (chip,) = ray.get(actor.visible_chips.remote(), timeout=60)

        def holders() -> list[tuple[str, str]]:
            s = lab.snapshot().slice(res.slice_names[0])
            return [(st, who) for h in s.hosts for st, who in zip(h.chip_states(), h.chip_holders,
                                                                  strict=False) if who]

        assert wait_until(lambda: holders() != [], 15)
        ((state, who),) = holders()
        assert state == "reserved" and who.startswith("chipres: Holder (job "), who
        host = next(h for h in lab.snapshot().slice(res.slice_names[0]).hosts if h.chip_holders)
        assert host.chip_holders[chip] == who and host.chip_layout == "rrrr"
    finally:
        ray.kill(actor)
        res.release()
