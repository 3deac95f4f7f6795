"""What every ``%raytpu`` subcommand handler reads: the session it drives and the IPython shell."""

from __future__ import annotations

from typing import Any

from raytpu_lab.lab import Session, get_lab

__all__ = ["CommandContext"]


class CommandContext:
    """Base of the handler groups mixed into :class:`~raytpu_lab.magics.RaytpuMagics`.

    ``session`` is the one given to the magics (``RaytpuMagics(shell, session=...)``), else the
    kernel's (:func:`~raytpu_lab.lab.get_lab`, which :func:`~raytpu_lab.lab.use_session` swaps).
    """

    shell: Any
    _session: Session | None = None

    @property
    def session(self) -> Session:
        return self._session if self._session is not None else get_lab()

    @property
    def _shell(self) -> Any:
        assert self.shell is not None, "magics run inside an IPython shell"
        return self.shell
