"""``%raytpu`` and ``%%raytpu``: a thin layer over the session (:class:`raytpu_lab.lab.Session`).

Each subcommand parses its arguments (:mod:`.parser`, shared with the ``raytpu`` shell command),
calls one public method of the session and displays the result. Modules, by job:

- :mod:`.core`: the magic, the table from subcommand to handler.
- :mod:`.parser`: the argument parser.
- :mod:`.cluster_commands`, :mod:`.reservation_commands`, :mod:`.run_commands`: the handlers.
- :mod:`.watched_run`: the run a ``--background`` training cell leaves behind.
- :mod:`.awaiting`: the input transformers that make a training cell an awaited one.
- :mod:`.brief`: errors users can cause fail the cell as one short block (IPython's
  ``_render_traceback_`` hook, as ipyparallel's RemoteError does); ``--debug`` shows the traceback.
"""

from raytpu_lab.magics.core import RaytpuMagics
from raytpu_lab.magics.parser import build_parser
from raytpu_lab.magics.watched_run import WatchedRun

__all__ = ["RaytpuMagics", "WatchedRun", "build_parser"]
