"""Small wording helpers of the magics' messages."""

from __future__ import annotations


def count_of(count: int, noun: str) -> str:
    """``"1 slice"``, ``"2 slices"``."""
    return f"{count} {noun}{'' if count == 1 else 's'}"
