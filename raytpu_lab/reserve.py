"""Old home of :mod:`raytpu_lab.reservations.slices`, kept only for ``train/on_reservation.py``.

That module moves into :mod:`raytpu_lab.reservations` when the run path is merged; then this file goes.
"""

from __future__ import annotations

from raytpu_lab.reservations.slices import (  # noqa: F401  (re-exported for train/on_reservation.py)
    RESERVATION_PREFIX,
    Reservation,
    _remove_quietly,
    adopt,
    diagnose,
    reserve,
    reserve_slices,
)

__all__ = ["Reservation", "reserve", "reserve_slices", "adopt", "diagnose", "RESERVATION_PREFIX"]
