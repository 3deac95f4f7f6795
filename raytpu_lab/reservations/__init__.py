"""Everything about reservations: whole TPU slices this session holds, and what runs on them.

- :mod:`~raytpu_lab.reservations.info` (pure): placement-group names and the cluster's
  reservations read from a raw state (:class:`ReservationInfo`), host order of a reservation;
- :mod:`~raytpu_lab.reservations.slices`: reserving whole slices through
  ``ray.util.tpu.slice_placement_group`` plus head locks (:class:`Reservation`), adopting a
  detached one, diagnosing why none is free;
- :mod:`~raytpu_lab.reservations.spmd`: one persistent process per host of a reservation
  (``%%raytpu run --on``);
- :mod:`~raytpu_lab.reservations.service`: the session's book of reservations
  (reserve, release, attach, list) over an injectable state reader;
- :mod:`~raytpu_lab.reservations.loans`: a reservation lent to one Ray Train run (it lands there
  or is aborted; the reservation takes its slices back when the run ends).

Importing this package imports no Ray (the pure part is re-exported; import the others directly).
"""

from __future__ import annotations

from raytpu_lab.reservations.info import (
    HostSlot,
    ReservationInfo,
    head_lock_name,
    host_order,
    list_reservations,
    reservation_group_name,
)

__all__ = [
    "HostSlot",
    "ReservationInfo",
    "head_lock_name",
    "host_order",
    "list_reservations",
    "reservation_group_name",
]
