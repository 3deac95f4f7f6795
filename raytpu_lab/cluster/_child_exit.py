"""How a forked child that runs someone else's ``main`` ends: with that ``main``'s exit status.

The launcher's node children (Ray's CLI) and the fork server's agents (Ray's agent scripts) are
forks of a long-lived process, so they must never return into its loop or run its ``atexit``
handlers: they end with ``os._exit`` once their streams are flushed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import NoReturn


def run_then_exit(main: Callable[[], int | None]) -> NoReturn:
    """Run ``main()`` and end this process with its status: its return value (``None`` is 0),
    a ``SystemExit``'s code, or 1 after printing the traceback of any other exception."""
    code = 1
    try:
        code = main() or 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
