"""The session's reservations: reserve, release, attach and list, over an injectable state reader.

One :class:`ReservationService` per session keeps the reservations this session holds by name;
:func:`no_reservation_error` is the one "no reservation named X" error everyone raises.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from raytpu_lab._checks import require_positive
from raytpu_lab.advice import cmd, opt
from raytpu_lab.errors import ReservationError
from raytpu_lab.reservations.info import ReservationInfo
from raytpu_lab.tpu.topology import SliceShape

if TYPE_CHECKING:
    from raytpu_lab.reservations.slices import Reservation
    from raytpu_lab.session.reader import StateReader

__all__ = ["ReservationService", "no_reservation_error"]


def no_reservation_error(name: str, held: list[str]) -> ReservationError:
    """The error for a reservation name this session does not hold (``held``: the names it does).

    Returns:
        A :class:`ReservationError` listing ``held`` and how to get one.
    """
    return ReservationError(f"No reservation named {name!r} in this session.",
                            why=f"Reservations held: {', '.join(held) or 'none'}.",
                            fix=("Reserve it (", cmd("reserve", "..."), "), attach a detached one (",
                                 cmd("attach", "NAME"), "), or list them (",
                                 cmd("reservations-all"), ")."))


class ReservationService:
    """The reservations one session holds, by name (oldest first).

    Args:
        reader: Reads the cluster (snapshots for picking and settling, the cluster's
            reservations for adopting detached ones).
        on_release: Called with a reservation's name just before its slices are given back
            (the session closes the host processes that use its chips).
    """

    def __init__(self, reader: StateReader,
                 on_release: Callable[[str], None] = lambda name: None) -> None:
        self.reader = reader
        self.on_release = on_release
        self.held: dict[str, Reservation] = {}
        self._names = itertools.count(1)

    def get(self, name: str) -> Reservation:
        """This session's reservation ``name``.

        Raises:
            ReservationError: This session holds none of that name (:func:`no_reservation_error`).
        """
        res = self.held.get(name)
        if res is None:
            raise no_reservation_error(name, list(self.held))
        return res

    def own_slices(self) -> set[str]:
        """Names of every slice this session's reservations hold."""
        return {s for r in self.held.values() for s in r.slice_names}

    def reserve(self, topology: str, version: str, *, slices: int = 1, name: str | None = None,
                timeout_s: float = 60.0, detached: bool = False,
                on_wait: Callable[[float], None] | None = None) -> Reservation:
        """Reserve whole slices atomically (see :func:`raytpu_lab.reservations.slices.reserve`).

        Args:
            topology: e.g. ``"4x4"``.
            version: e.g. ``"v6e"``.
            slices: Slices to hold together.
            name: Reservation name; ``r1``, ``r2``... if omitted.
            timeout_s: Seconds to wait for free slices.
            detached: Keep it after this kernel exits.
            on_wait: Progress callback, called with seconds elapsed while waiting.

        Raises:
            InvalidTopologyError: Topology not valid for the generation (nothing requested).
            NotConnectedError: No cluster connected.
            ReservationError: The name is taken.
            NoSliceAvailableError: No intact idle slices within ``timeout_s`` (or never enough).
        """
        from raytpu_lab.reservations.slices import reserve

        shape = SliceShape.of(version, topology)
        require_positive("timeout", timeout_s)
        require_positive("slices", slices)
        self.reader.require("reserve a slice")
        if name is not None and (not name.strip() or any(c.isspace() for c in name)):
            raise ReservationError(f"{name!r} is not a reservation name.",
                                   why="Names are one word: they name placement groups.",
                                   fix=("Use letters, digits, '-' or '_', e.g. ",
                                        opt("name", "r1"), "."))
        name = name or self._next_name()
        if name in self.held:
            raise ReservationError(f"A reservation named {name!r} exists already.",
                                   fix=("Pick another name, or release it first: ",
                                        cmd("release", name)))
        res = reserve(shape, self.reader.snapshot, name=name, num_slices=slices,
                      timeout_s=timeout_s, detached=detached, on_wait=on_wait)
        self.held[name] = res
        return res

    def release(self, name: str, *, settle_s: float = 10.0) -> None:
        """Release reservation ``name`` (this session's, or a detached one on the cluster made
        by another kernel) and wait at most ``settle_s`` seconds until Ray shows its slices
        free again, so the next ``status`` or ``reserve`` is truthful.

        Raises:
            ReservationError: Neither this session nor the cluster (detached) holds ``name``.
        """
        res = self.held.pop(name, None)
        if res is None and self.reader.connected():
            res = self._adopt_detached(name)  # a detached one made by another driver, if any
        if res is None:
            raise no_reservation_error(name, list(self.held))
        self.on_release(name)
        res.release()
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline:
            snap = self.reader.snapshot()
            if all(s.idle for s in snap.slices if s.name in res.slice_names):
                return
            time.sleep(0.2)

    def attach(self, name: str) -> Reservation:
        """Adopt a detached reservation another driver (kernel) made, as if this session made
        it (``release``, ``run_on``, ``down`` treat it as this session's; it stays detached).

        Raises:
            NotConnectedError: No cluster connected.
            ReservationError: No detached reservation of that name on the cluster (the message
                lists those that exist), or this session holds one of that name already.
        """
        self.reader.require("attach a reservation")
        if name in self.held:
            raise ReservationError(f"Reservation {name!r} is this session's already.",
                                   fix=("Use it directly, or release it: ", cmd("release", name)))
        res = self._adopt_detached(name)
        if res is None:
            infos = self.reader.reservations()
            listed = ", ".join(f"{r.name} ({'detached' if r.detached else 'default lifetime'})"
                               for r in infos) or "none"
            info = next((r for r in infos if r.name == name), None)
            why = (f"{name!r} has the default lifetime: it belongs to the driver that made it and "
                   "ends with it." if info is not None else f"Reservations on the cluster: {listed}.")
            raise ReservationError(f"No detached reservation named {name!r} on the cluster.",
                                   why=why, fix=("List them with ", cmd("reservations-all"), "."))
        self.held[name] = res
        return res

    def release_all(self, *, keep_detached: bool = False) -> None:
        """Give back every reservation of this session (``keep_detached``: leave detached ones
        on the cluster, as at kernel exit or on connecting elsewhere) and forget them."""
        for name, res in list(self.held.items()):
            self.on_release(name)
            if not (keep_detached and res.detached):
                res.release()
        self.held.clear()

    def _adopt_detached(self, name: str) -> Reservation | None:
        from raytpu_lab.reservations.slices import adopt

        info: ReservationInfo | None = next(
            (r for r in self.reader.reservations() if r.name == name and r.detached), None)
        if info is None:
            return None
        if not info.slice_names or not info.topology:
            raise ReservationError(
                f"Reservation {name!r} is on the cluster but not placed ({info.state}).",
                why="Its bundles sit on no live host, so its slices are unknown.",
                fix=f"Release it from the kernel that made it, or wait; state: {info.state}.")
        slice_state = self.reader.snapshot().slice(info.slice_names[0])
        if not isinstance(slice_state.shape, SliceShape):
            raise ReservationError(
                f"Reservation {name!r} is on slice {slice_state.name}, whose TPU shape is unknown "
                f"({slice_state.shape.spec}).",
                why="Its labels name no shape in the topology tables, so its hosts and chips "
                    "cannot be checked against a shape.",
                fix="Release it from the kernel that made it.")
        return adopt(info, slice_state.shape)

    def _next_name(self) -> str:
        while True:
            name = f"r{next(self._names)}"
            if name not in self.held:
                return name
