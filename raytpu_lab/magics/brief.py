"""How a ``%raytpu`` cell shows an error: one short block (what, why, what to do) for errors
users can cause, the full traceback with ``--debug``, never a traceback through our frames
otherwise (IPython's ``_render_traceback_`` hook, as ipyparallel's RemoteError uses)."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Coroutine
from typing import Any, NoReturn

from IPython.core.error import UsageError

from raytpu_lab.errors import InvalidTopologyError, RaytpuError

__all__ = ["Brief", "DebugTraceback", "brief_errors", "in_cell", "with_brief_errors"]


class DebugTraceback(Exception):
    """``--debug``: raised from a :class:`RaytpuError` so IPython prints the full traceback."""


class Brief(Exception):
    """An unexpected error, shown as one block without a traceback (``--debug`` shows it)."""

    def _render_traceback_(self) -> list[str]:
        return str(self).splitlines()


def in_cell(err: RaytpuError) -> RaytpuError:
    """The one place a cell spells an error's advice (``%raytpu release r1``, ``--timeout``);
    in place, returns ``err``."""
    return err.respell("cell")


def brief_errors(args: argparse.Namespace, err: BaseException) -> NoReturn:
    """Re-raise ``err`` as users should see it: one short block unless ``--debug``."""
    if isinstance(err, InvalidTopologyError):
        err = _in_command_syntax(err, args.command)
    if isinstance(err, RaytpuError):
        in_cell(err)
        if args.debug:  # RaytpuError renders as a short block; chain it so IPython shows frames
            raise DebugTraceback(f"{type(err).__name__}: {err.what} (traceback above)") from err
        err.__cause__ = err.__context__ = None
        # shown by IPython through RaytpuError._render_traceback_: one short block
        raise err.with_traceback(None) from None
    if isinstance(err, KeyboardInterrupt | asyncio.CancelledError) and not args.debug:
        raise Brief(f"raytpu {args.command}: interrupted.") from None
    if isinstance(err, UsageError | Brief) or not isinstance(err, Exception) or args.debug:
        raise err
    raise Brief(f"raytpu {args.command}: {type(err).__name__}: {err}\n"
                 "(run again with --debug for the traceback)") from None


_SHAPE_SYNTAX = {
    "up": "--tpu {version}:{topology}",
    "reserve": "reserve {topology} --version {version}",
    "jax": "--topology {topology} --version {version}",
    "torch": "--topology {topology} --version {version}",
}


def _in_command_syntax(err: InvalidTopologyError, command: str | None) -> InvalidTopologyError:
    """The error with its suggestions written as the failed command takes a shape, e.g.
    ``reserve 4x4 --version v6e`` rather than ``v6e:4x4``."""
    form = _SHAPE_SYNTAX.get(command or "")
    return err if form is None else err.in_syntax(form)


async def with_brief_errors(args: argparse.Namespace, coro: Coroutine[Any, Any, Any]) -> Any:
    try:
        return await coro
    except BaseException as err:
        brief_errors(args, err)
