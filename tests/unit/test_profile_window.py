"""--profile START:STOP / profile=(start, stop): parsed before anything starts, bad input refused."""

from __future__ import annotations

import pytest

from raytpu_lab.errors import TrainingConfigError
from raytpu_lab.train.profile import ProfileWindow, parse_profile_window
from raytpu_lab.train.profile_analysis import window_message


@pytest.mark.parametrize(("value", "expected"), [
    ("5:8", ProfileWindow(5, 8)), (" 0:1 ", ProfileWindow(0, 1)), ((2, 3), ProfileWindow(2, 3)),
    ([10, 20], ProfileWindow(10, 20)), (ProfileWindow(1, 4), ProfileWindow(1, 4)),
])
def test_valid_windows(value, expected: ProfileWindow) -> None:
    assert parse_profile_window(value) == expected


@pytest.mark.parametrize(("value", "needle"), [
    ("5", "not START:STOP"), ("a:b", "not START:STOP"), ("1:2:3", "not START:STOP"),
    ("", "not START:STOP"), ("8:5", "empty or negative"), ("3:3", "empty or negative"),
    ("-1:4", "empty or negative"), ((1.5, 3), "not a pair"), ((True, 3), "not a pair"),
    ((1, 2, 3), "not a pair"), (7, "not a pair"),
])
def test_bad_windows_are_one_clear_error(value, needle: str) -> None:
    with pytest.raises(TrainingConfigError) as info:
        parse_profile_window(value)
    text = str(info.value)
    assert needle in text and "What to do:" in text and "ray.train.report" in text


def test_window_message_says_what_was_reached() -> None:
    assert window_message((5, 8), 20) is None
    assert window_message((5, 8), 8) is None
    assert window_message((50, 60), 20) == (
        "profile window 50:60 never reached: the run reported 20 steps")
    assert window_message((1, 2), 1) == "profile window 1:2 never reached: the run reported 1 step"
    assert window_message((5, 30), 20) == (
        "profile window 5:30 cut short: the run reported 20 steps, so steps 5..19 were traced")
