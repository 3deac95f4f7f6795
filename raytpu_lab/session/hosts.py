"""Per-host sessions: the persistent host processes of each reservation (``run_on``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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

    def close(self, name: str | None = None) -> None:
        """Stop the host processes of reservation ``name`` (``None``: of every reservation)."""
        for key in [name] if name is not None else list(self.sessions):
            session = self.sessions.pop(key, None)
            if session is not None:
                session.close()
