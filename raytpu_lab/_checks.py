"""Argument checks shared by the session services (and the training section of the session)."""

from __future__ import annotations

import math

from raytpu_lab.advice import opt
from raytpu_lab.errors import RaytpuError

__all__ = ["require_positive"]


def require_positive(option: str, value: float) -> None:
    """Raise unless ``value`` is a finite number above 0 (``option``: its name, e.g. "timeout").

    Raises:
        RaytpuError: ``value`` is 0 or below, nan or infinite (a wait must end).
    """
    if not (value > 0 and math.isfinite(value)):
        raise RaytpuError((opt(option, value), " is not allowed."),
                          why="It must be a finite number above 0.",
                          fix=("Pass a positive ", opt(option), "."))
