"""``--background`` runs: the cell returns once the run is submitted; its launch (waiting for free
slices, starting Ray Train) runs in the run's own thread. Here the launch is a stand-in, so each
outcome (started, failed to start, stopped before it started) can be held and checked."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from raytpu_lab.errors import NoSliceAvailableError
from raytpu_lab.magics import WatchedRun
from raytpu_lab.magics.brief import Brief as _Brief


class _Display:
    def __init__(self) -> None:
        self.shown: list[dict] = []

    def update(self, data: dict, raw: bool = False) -> None:
        self.shown.append(data)


def _dashboard() -> SimpleNamespace:
    return SimpleNamespace(title="bg", static_html=lambda: "<b>static</b>", text=lambda: "bg text",
                           show_error=lambda text: None)


class _Handle:
    name = "bg"

    def __init__(self) -> None:
        self.result = SimpleNamespace(records=[], worker_errors=[])
        self.done = False
        self.stopped = False

    def wait(self, timeout_s=None):
        self.done = True
        return self.result

    def stop(self, timeout_s: float = 10.0) -> bool:
        self.stopped = self.done = True
        return True


def _until(predicate) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_the_launch_runs_after_the_cell_returned() -> None:
    go, handle = threading.Event(), _Handle()

    def launch(on_launch):
        go.wait(10)
        on_launch()
        return handle

    run = WatchedRun.launching(launch, _dashboard(), _Display())
    assert not run.done and run.result is None and "starting" in repr(run)  # submitted only
    go.set()
    assert run.wait(10) is handle.result
    assert run.handle is handle and run.done


def test_a_failed_launch_replaces_the_dashboard_and_is_raised_by_wait() -> None:
    display = _Display()

    def launch(on_launch):
        raise NoSliceAvailableError("No free v4-16 slice within 60 s.", fix="Release one.")

    run = WatchedRun.launching(launch, _dashboard(), display)
    with pytest.raises(NoSliceAvailableError, match="No free v4-16 slice"):
        run.wait(10)
    assert run.done and run.result is None and "failed to start" in repr(run)
    assert len(display.shown) == 1
    assert "NoSliceAvailableError: No free v4-16 slice within 60 s." in display.shown[0]["text/plain"]
    assert "What to do: Release one." in display.shown[0]["text/html"]


def test_stop_before_the_launch_means_it_never_starts() -> None:
    waiting, started = threading.Event(), []

    def launch(on_launch):
        waiting.wait(10)  # e.g. waiting for a free slice
        on_launch()  # raises: stop came first
        started.append(True)
        return _Handle()

    run = WatchedRun.launching(launch, _dashboard(), _Display())
    stopper = threading.Thread(target=run.stop, args=(10,))
    stopper.start()
    _until(lambda: run._stop_wanted)
    waiting.set()
    stopper.join(10)
    assert not started
    with pytest.raises(_Brief, match="stopped before it started"):
        run.wait(10)


def test_stop_during_the_launch_stops_the_run_it_started() -> None:
    handle, release = _Handle(), threading.Event()

    def launch(on_launch):
        on_launch()  # passes: no stop yet
        release.wait(10)  # Ray Train starting
        return handle

    run = WatchedRun.launching(launch, _dashboard(), _Display())
    stopper = threading.Thread(target=run.stop, args=(10,))
    stopper.start()
    _until(lambda: run._stop_wanted)
    release.set()
    stopper.join(10)
    assert handle.stopped
