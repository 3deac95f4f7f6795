"""The ``%raytpu`` magic: split the line, parse it, call the subcommand's handler, show errors briefly."""

from __future__ import annotations

import argparse
import asyncio
import shlex
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class

from raytpu_lab.lab import Session
from raytpu_lab.magics.awaiting import await_run_cells, empty_cells_as_lines
from raytpu_lab.magics.brief import brief_errors, with_brief_errors
from raytpu_lab.magics.cluster_commands import ClusterCommands
from raytpu_lab.magics.parser import HelpShown, build_parser, join_expressions
from raytpu_lab.magics.reservation_commands import ReservationCommands
from raytpu_lab.magics.run_commands import RunCommands
from raytpu_lab.magics.serve_commands import ServeCommands

__all__ = ["RaytpuMagics"]

Handler = Callable[[Any, argparse.Namespace, "str | None"], Any]


@magics_class
class RaytpuMagics(ClusterCommands, ReservationCommands, RunCommands, ServeCommands, Magics):
    """``%raytpu COMMAND ...``, ``%%raytpu jax ...`` and ``%%raytpu torch ...``; ``%raytpu --help`` lists the commands.

    Args:
        shell: The IPython shell.
        session: The session the commands drive (default: the kernel's, :func:`get_lab`).
    """

    #: Subcommand -> handler ``(self, args, cell)``; every subcommand of :func:`build_parser`.
    HANDLERS: dict[str, Handler] = {
        "up": ClusterCommands._do_up, "down": ClusterCommands._do_down,
        "connect": ClusterCommands._do_connect, "status": ClusterCommands._do_status,
        "map": ClusterCommands._do_map, "apply": ClusterCommands._do_apply,
        "scale": ClusterCommands._do_scale, "delete": ClusterCommands._do_delete,
        "reserve": ReservationCommands._do_reserve, "release": ReservationCommands._do_release,
        "reservations": ReservationCommands._do_reservations,
        "attach": ReservationCommands._do_attach, "run": ReservationCommands._do_run,
        "check": ReservationCommands._do_check,
        "jax": RunCommands._do_jax, "torch": RunCommands._do_torch,
        "serve": ServeCommands._do_serve,
    }

    def __init__(self, shell: Any = None, session: Session | None = None, **kwargs: Any) -> None:
        super().__init__(shell, **kwargs)
        self._session = session
        cleanup = getattr(shell, "input_transformers_cleanup", None)
        if isinstance(cleanup, list):
            for transform in (empty_cells_as_lines, await_run_cells):
                if transform not in cleanup:
                    cleanup.append(transform)

    @line_cell_magic
    def raytpu(self, line: str, cell: str | None = None) -> Any:
        """Ray on Cloud TPUs: up, down, connect, status, map, reserve, release, reservations,
        attach, run, check, jax, torch, serve, apply, scale, delete."""
        parser = build_parser()
        try:
            words = join_expressions(shlex.split(line))
        except ValueError as err:  # an unclosed quote
            raise UsageError(f"raytpu: cannot split the line into arguments: {err}.\n"
                             "Close every quote (' or \") you opened.") from None
        try:
            args = parser.parse_args(words)
        except HelpShown:
            return None
        if not args.command:
            parser.print_help()
            return None
        handler = self.HANDLERS[args.command]
        try:
            result = handler(self, args, cell)
        except BaseException as err:
            brief_errors(args, err)
        if asyncio.iscoroutine(result):
            return with_brief_errors(args, result)
        return result
