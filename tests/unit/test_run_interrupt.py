"""Ctrl-C while a run is waited on in the main thread raises KeyboardInterrupt, whatever SIGINT
handler an earlier main-thread ``fit()`` left behind (Ray Train installs one per run)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from raytpu_lab.train.run import _ctrl_c_raises


def test_ctrl_c_raises_keyboard_interrupt_then_the_old_handler_is_back() -> None:
    def stale_ray_handler(signum, frame):  # what Ray's handler does once its controller is gone
        raise SystemExit(0)

    before = signal.signal(signal.SIGINT, stale_ray_handler)
    try:
        with pytest.raises(KeyboardInterrupt), _ctrl_c_raises():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler runs here at the latest
        assert signal.getsignal(signal.SIGINT) is stale_ray_handler
    finally:
        signal.signal(signal.SIGINT, before)


def test_the_autoscalers_unplaceable_notice_is_muted_with_the_run_other_lines_are_not() -> None:
    from functools import partial

    from raytpu_lab.train.run import _is_runs_log

    is_ours = partial(_is_runs_log, {"123"}, "01000000")  # the run's worker pids and job id
    assert is_ours({"pid": 123, "lines": ["step 1"]})
    assert is_ours({"pid": "autoscaler", "lines": [
        "Warning: The following resource request cannot be scheduled right now: "
        "No available node types can fulfill placement group requests (detail: ...)"]})
    assert not is_ours({"pid": "autoscaler", "lines": ["Adding 2 node(s) of type tpu-v6e"]})
    assert not is_ours({"pid": 999, "job": "02000000", "lines": ["other job"]})
