"""IPython input transformers of the ``%%raytpu`` cells.

Why they exist: a cell magic is a plain function call, so a blocking ``%%raytpu jax`` cell would
hold the kernel's event loop for the whole run and the dashboard's Stop button (a widget message)
would only arrive after the run ended. Rewritten as ``await get_ipython().run_cell_magic(...)``
(with the hidden ``--await`` flag, so the magic returns a coroutine), the cell runs under
IPython's autoawait and the kernel keeps serving widget messages while it waits. This uses
IPython's ``_asyncio_runner`` (private) to tell that autoawait runs on asyncio; with any other
runner the cell is left as written and blocks, and Ctrl-C still stops the run. The second
transformer lets ``%%raytpu run --help`` (an empty cell body, which IPython refuses) show its help.
Tested in tests/unit/test_awaited_cells.py.
"""

from __future__ import annotations

import shlex
from typing import Any

from IPython import get_ipython
from IPython.core.async_helpers import _asyncio_runner

__all__ = ["await_run_cells", "empty_cells_as_lines"]


def await_run_cells(lines: list[str]) -> list[str]:
    """IPython input transformer: a ``%%raytpu jax`` (or ``torch``) cell becomes ``await <the magic>``.

    An awaited cell leaves the kernel's event loop free while the run streams, and ipykernel
    (>= 7.4) dispatches widget (comm) messages during a running async cell, so the Stop button
    works; a kernel interrupt cancels the await, which stops the run. Only when IPython's
    autoawait runs on asyncio; otherwise the magic blocks (Ctrl-C still stops the run).
    """
    if not lines or not lines[0].startswith("%%raytpu"):
        return lines
    shell = _current_shell()
    if shell is None or not getattr(shell, "autoawait", False) \
            or shell.loop_runner is not _asyncio_runner:
        return lines
    line = lines[0][len("%%raytpu"):].strip()
    try:
        words = shlex.split(line)
    except ValueError:
        return lines
    command = next((w for w in words if not w.startswith("-")), None)
    if command not in ("jax", "torch") or "--background" in words or "-h" in words or "--help" in words:
        return lines
    body = "".join(lines[1:])
    return [f"await get_ipython().run_cell_magic('raytpu', {('--await ' + line)!r}, {body!r})\n"]


def empty_cells_as_lines(lines: list[str]) -> list[str]:
    """IPython input transformer: a ``%%raytpu`` cell with an empty body runs as ``%raytpu``.

    IPython refuses a cell magic with an empty body before the magic sees it ("cell body is
    empty"), so ``%%raytpu run --help`` would never show its help; as a line magic the help
    shows, and a cell subcommand without its cell says what the cell should hold.
    """
    if not lines or not lines[0].startswith("%%raytpu") or "".join(lines[1:]).strip():
        return lines
    rest = lines[0][len("%%raytpu"):]
    if rest[:1] not in ("", " ", "\t", "\n"):
        return lines  # another magic whose name starts with raytpu
    return [f"get_ipython().run_line_magic('raytpu', {rest.strip()!r})\n"]


def _current_shell() -> Any:
    return get_ipython()
