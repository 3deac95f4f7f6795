"""The session's live map on the emulated cluster: one widget, one refresher, changes within seconds."""

from __future__ import annotations

import threading
import time

import ipywidgets
import pytest

from raytpu_lab.lab import Lab

from .conftest import wait_until


def test_map_is_one_widget_fed_by_one_refresher(lab: Lab) -> None:
    def refreshers() -> int:  # other tests' sessions may still poll: count this one's only
        return sum(t.name == "raytpu-refresher" for t in threading.enumerate())

    widgets_before, refreshers_before = len(ipywidgets.Widget.widgets), refreshers()
    first = lab.map(interval_s=0.2)
    for _ in range(4):
        assert lab.map() is first
    assert refreshers() - refreshers_before == 1
    assert len(ipywidgets.Widget.widgets) - widgets_before <= 2  # the map (and its Layout)

    sent: list[dict] = []
    original = first.send
    first.send = lambda msg, buffers=None: (sent.append(msg), original(msg, buffers))[1]
    res = lab.reserve("4x4", "v6e", name="mapped")
    assert set(first.highlight) == set(res.slice_names)
    held = res.slice_names[0]
    assert wait_until(lambda: first.snapshot is not None and first.snapshot.slice(held).state == "reserved")
    deltas = [m for m in sent if m.get("type") == "delta"]
    assert deltas and all(len(str(m)) < 4096 for m in deltas)
    lab.release("mapped")
    assert wait_until(lambda: first.snapshot.slice(held).state == "free")

    first.close()
    assert wait_until(lambda: not lab.refresher.running)
    assert len(ipywidgets.Widget.widgets) <= widgets_before + 1


@pytest.mark.slow
def test_a_running_jax_run_shows_as_busy_by_its_name(lab: Lab) -> None:
    seen: list[tuple[str, list[str]]] = []

    def train(config):

        import ray.train

        for step in range(4):
            time.sleep(0.5)
            ray.train.report({"step": step, "loss": 1.0 / (step + 1)})

    holders: set[str] = set()

    def on_records(_records) -> None:
        for s in lab.snapshot().slices_of("v6e-16"):
            if s.owners:
                seen.append((s.state, list(s.owners)))
                holders.update(who for h in s.hosts for who in h.chip_holders if who)

    run = lab.train_jax(train, "4x4", "v6e", name="mapjob", on_records=on_records)
    assert run.steps == 4 and len(run.slice_names) == 1
    assert ("busy", ["run mapjob"]) in seen, seen
    # each host's chips are held by the run's Ray Train worker there, named with the run
    assert holders and all(who.startswith("run mapjob: ") for who in holders), holders
    assert wait_until(lambda: all(s.owners == [] for s in lab.snapshot().slices_of("v6e-16")), 15)
