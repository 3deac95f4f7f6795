"""argparse value types shared by the ``%raytpu`` magics and the ``raytpu`` shell command."""

from __future__ import annotations

import argparse
import math

__all__ = ["positive_seconds"]


def positive_seconds(text: str) -> float:
    """argparse type: a finite number of seconds above 0 (``nan`` and ``inf`` are refused: a
    wait that never ends would hang the cell or the shell)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text} s: it must be a finite number above 0")
    return value
