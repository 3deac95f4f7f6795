"""The session's one refresher, driven by a plain function (no Ray)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from raytpu_lab.session.refresher import Refresher
from raytpu_lab.state.model import build_snapshot

RAW = json.loads((Path(__file__).parent / "fixtures" / "raw_v6e_4x4_x2_idle.json").read_text())


class FakeView:
    def __init__(self) -> None:
        self.snapshots: list = []
        self.statuses: list[str] = []
        self.closed = False

    def update(self, snapshot) -> None:
        self.snapshots.append(snapshot)

    def set_status(self, text: str) -> None:
        self.statuses.append(text)


def _until(predicate, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def _threads() -> int:
    return sum(t.name == "raytpu-refresher" for t in threading.enumerate())


def test_feeds_every_view_and_ends_when_views_close() -> None:
    refresher = Refresher(lambda: build_snapshot(RAW), interval_s=0.02)
    views = [FakeView() for _ in range(5)]
    for view in views:
        refresher.add(view)
    assert _until(lambda: all(len(v.snapshots) >= 2 for v in views))
    assert _threads() == 1
    for view in views:
        view.closed = True
    assert _until(lambda: not refresher.running)
    assert _threads() == 0


def test_disconnect_is_shown_once_and_cleared_on_recovery() -> None:
    state = {"up": False}

    def read():
        if not state["up"]:
            raise ConnectionError("GCS gone")
        return build_snapshot(RAW)

    refresher = Refresher(read, interval_s=0.02)
    view = FakeView()
    refresher.add(view)
    assert _until(lambda: view.statuses)
    time.sleep(0.1)
    assert len(view.statuses) == 1 and "disconnected" in view.statuses[0]
    assert not view.snapshots
    state["up"] = True
    assert _until(lambda: view.snapshots)
    assert view.statuses[-1] == ""
    refresher.stop()


def test_pause_stops_reading_and_resume_reads_at_once() -> None:
    calls = []
    refresher = Refresher(lambda: calls.append(1) or build_snapshot(RAW), interval_s=0.02)
    view = FakeView()
    refresher.add(view)
    assert _until(lambda: calls)
    refresher.pause()
    time.sleep(0.05)
    seen = len(calls)
    time.sleep(0.15)
    assert len(calls) == seen
    refresher.interval_s = 60
    refresher.resume()
    assert _until(lambda: len(calls) > seen, timeout_s=2)
    refresher.stop()
    assert not refresher.running


def test_interval_must_be_positive() -> None:
    import pytest

    with pytest.raises(ValueError):
        Refresher(lambda: build_snapshot(RAW), interval_s=0)
