"""Per-host sessions: the persistent host processes of each reservation (``run_on``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from raytpu_lab._checks import require_positive
from raytpu_lab.reservations.check import check_reservation, check_slices
from raytpu_lab.reservations.check_report import CheckReport
from raytpu_lab.reservations.service import ReservationService
from raytpu_lab.reservations.spmd import CellResult, SliceSession, check_cell

__all__ = ["HostSessions"]


class HostSessions:
    """One :class:`~raytpu_lab.reservations.spmd.SliceSession` per reservation, started on
    first use and closed when the reservation is released.

    Args:
        reservations: Where the reservations are looked up by name.
    """

    def __init__(self, reservations: ReservationService) -> None:
        self.reservations = reservations
        self.sessions: dict[str, SliceSession] = {}

    def slice_session(self, name: str, *, init_jax: bool = True, timeout_s: float = 120.0,
                      ) -> SliceSession:
        """The persistent host processes of reservation ``name`` (started on first use): one
        Ray actor per host in worker-id order, ``jax.distributed`` initialised once. They live
        until the reservation is released, the session is shut down (``down``), or the kernel exits.

        Raises:
            ReservationError: This session holds no reservation ``name`` (attach it first if
                another kernel made it), or its hosts are not all placed.
            RemoteHostError: A host failed to start or to initialise JAX.
        """
        res = self.reservations.get(name)
        session = self.sessions.get(name)
        if session is None or not session.started:
            session = SliceSession(res, init_jax=init_jax, timeout_s=timeout_s)
            self.sessions[name] = session
            session.start()
        return session

    def run_on(self, name: str, code_or_fn: str | Callable[..., Any], *args: Any,
               **kwargs: Any) -> CellResult:
        """Run code (a cell's text) or call a function on every host of reservation ``name``;
        variables persist per host from call to call.

        Returns:
            Output per host in worker-id order; ``.values`` is the list of return values.

        Raises:
            SyntaxError: The code does not parse (nothing was started or sent).
            ReservationError: See :meth:`slice_session`.
            RemoteHostError: It raised on a host (that host's traceback; ``.result`` has all).
            KeyboardInterrupt: Interrupted; the cell was stopped on every host first.
        """
        if isinstance(code_or_fn, str):
            check_cell(code_or_fn)  # before a session (host actors, jax.distributed) is started
        session = self.slice_session(name)
        if isinstance(code_or_fn, str):
            return session.run(code_or_fn)
        return session.call(code_or_fn, *args, **kwargs)

    def check(self, name: str | None = None, *, timeout_s: float = 60.0) -> CheckReport:
        """Smoke-test hosts: JAX device counts, process index and a blocked ``psum`` per host.

        Args:
            name: This session's reservation to check (in its running per-host processes if it
                has them, else in temporary ones); ``None``: every idle intact slice of the
                cluster, each reserved for the check and released after.
            timeout_s: Seconds a host may stay silent before it is named as ``timeout``.

        Returns:
            A table with one row per host (see :class:`~raytpu_lab.reservations.check_report.CheckReport`).

        Raises:
            NotConnectedError: No cluster connected.
            ReservationError: This session holds no reservation ``name``.
            RaytpuError: ``timeout_s`` is not positive.
        """
        require_positive("timeout", timeout_s)
        reader = self.reservations.reader
        reader.require("check the hosts")
        if name is None:
            return check_slices(reader.snapshot(), timeout_s=timeout_s)
        res = self.reservations.get(name)
        return check_reservation(res, timeout_s=timeout_s, session=self.sessions.get(name))

    def close(self, name: str | None = None) -> None:
        """Stop the host processes of reservation ``name`` (``None``: of every reservation)."""
        for key in [name] if name is not None else list(self.sessions):
            session = self.sessions.pop(key, None)
            if session is not None:
                session.close()
