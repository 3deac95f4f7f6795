"""A stop asked for while Ray Train is still starting is carried out once the controller
announces itself, even when the stop had given up waiting for it (seen: the sidebar's Stop 2 s
into a run whose controller announced itself 12 s in; the run went on for ever)."""

from __future__ import annotations

import threading
import time
from typing import Any

from raytpu_lab.tpu.topology import parse_spec
from raytpu_lab.train import run as run_module
from raytpu_lab.train.result import RunResult


class _ListQueue:
    """What the drain thread uses of a ``ray.util.queue.Queue``, in memory."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.lock = threading.Lock()

    def qsize(self) -> int:
        return len(self.items)

    def get_nowait_batch(self, n: int) -> list[Any]:
        with self.lock:
            out, self.items = self.items[:n], self.items[n:]
        return out

    def shutdown(self, force: bool = False) -> None:
        pass


def _handle(monkeypatch: Any) -> tuple[run_module.RunHandle, _ListQueue, list[Any]]:
    aborted: list[Any] = []
    ended = threading.Event()

    def abort(controller: Any, timeout_s: float) -> None:
        aborted.append(controller)
        ended.set()  # Ray Train's fit() returns once its controller aborted

    monkeypatch.setattr(run_module._ray_private, "abort_train_controller", abort)
    monkeypatch.setattr(run_module, "_live", lambda pg_ids: [])
    monkeypatch.setattr(run_module, "_remove_orphans", lambda others: [])
    monkeypatch.setattr(run_module, "_job_id", lambda: None)  # would start a local Ray
    events = _ListQueue()
    handle = run_module.RunHandle(
        "r", RunResult(name="r", shape=parse_spec("v4:2x2x2"), num_slices=1),
        fit=lambda: ended.wait(30), events=events, logs=_ListQueue(),  # type: ignore[arg-type]
        find_slices=None, poll_interval_s=0.02, mute_driver_logs=False, error_text=str)
    return handle, events, aborted


def test_a_stop_before_the_controller_is_carried_out_when_it_arrives(monkeypatch: Any) -> None:
    handle, events, aborted = _handle(monkeypatch)
    handle.start()
    assert handle.stop(timeout_s=0.3) is False  # no controller yet: the run has not ended
    assert not handle.done and aborted == []
    events.items.append({"kind": "controller", "handle": "the-controller", "pid": 7})
    deadline = time.monotonic() + 5
    while not handle.done and time.monotonic() < deadline:
        time.sleep(0.02)
    assert handle.done and handle.result.stopped
    assert aborted == ["the-controller"]  # asked once


def test_a_run_not_stopped_is_left_alone_when_its_controller_arrives(monkeypatch: Any) -> None:
    handle, events, aborted = _handle(monkeypatch)
    handle.start()
    events.items.append({"kind": "controller", "handle": "the-controller", "pid": 7})
    time.sleep(0.3)
    assert not handle.done and aborted == []
    assert handle.stop(timeout_s=5) is True
    assert aborted == ["the-controller"]
