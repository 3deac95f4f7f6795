"""Which of Ray Serve's own log lines a notebook need not print (pure; no Ray).

Ray's driver prints every worker's log lines in whichever cell runs (``log_to_driver``); Serve's
controller, proxies and replicas log at INFO on each deployment step and request ("Deploying new
version of Deployment...", "Got updated endpoints...", access lines), which buried the cell's own
answer ("Serving 'echo' at ...") under a screen of red stderr. Ray's log files keep every line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["is_serve_chatter", "SERVE_ACTORS"]

#: Actor names of Serve's own processes, as Ray's log batches carry them (``actor_name``);
#: replicas are ``ServeReplica:<app>:<deployment>``.
SERVE_ACTORS = ("ServeController", "ProxyActor", "ServeReplica:")

# Serve's log format (ray/serve/_private/logging_utils.py): "INFO 2026-12-02 15:10:47,330 ...".
_ROUTINE = re.compile(r"\s*(?:INFO|DEBUG) \d{4}-\d\d-\d\d ")


def is_serve_chatter(batch: Mapping[str, Any]) -> bool:
    """Whether a log batch of Ray's driver printer (``{"actor_name", "pid", "lines", ...}``) is
    only Serve's routine INFO/DEBUG lines from Serve's own actors: a batch with any other line (a
    warning, an error, a replica's ``print``) is printed whole."""
    name = str(batch.get("actor_name") or "")
    lines = batch.get("lines") or []
    return (name.startswith(SERVE_ACTORS) and bool(lines)
            and all(_ROUTINE.match(str(line)) for line in lines))
