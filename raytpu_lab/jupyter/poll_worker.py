"""The sidebar's poller process: the one Ray driver per cluster that the Jupyter server talks to.

Run by :class:`raytpu_lab.jupyter.poller.SubprocessSource` as
``python -m raytpu_lab.jupyter.poll_worker ADDRESS INTERVAL_S``. The Jupyter server itself never
calls ``ray.init``: a driver in the server process would pin Ray's global state (one cluster per
process, its threads and gRPC channels, its crash on a lost GCS) into the server every tab talks
to. This process connects once, then every ``INTERVAL_S`` seconds prints one JSON line on stdout::

    {"type": "state", "raw": RawState, "lifetimes": {...}, "runs": [RunEntry, ...]}

(or ``{"type": "error", "error": "..."}`` when a read failed; it retries), and answers commands
read from stdin, one JSON object a line, with ``{"type": "reply", "id": ..., "ok": bool,
"error": str}``:

- ``{"id", "op": "release", "name"}``: remove reservation ``name``'s placement group and head locks
  (whoever holds it: any kernel, driver or job);
- ``{"id", "op": "stop", "key"}``: ask run ``key`` (:func:`raytpu_lab.train.board.request_stop`)
  to stop.

Ray's auth token (if the cluster uses one) stays in this process's environment; nothing printed
carries it.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

__all__ = ["main"]

_OUT = threading.Lock()
_STREAM: Any = None  # the real stdout; fd 1 itself goes to stderr (Ray may print there)


def _emit(message: dict[str, Any]) -> None:
    line = json.dumps(message, separators=(",", ":"))
    with _OUT:
        stream = _STREAM or sys.stdout
        stream.write(line + "\n")
        stream.flush()


def _release(name: str) -> str:
    """Remove reservation ``name``; ``""`` on success, else why not."""
    from raytpu_lab import _ray_private
    from raytpu_lab.reservations.info import list_reservations
    from raytpu_lab.state.fetch import fetch_raw_state

    found = [r for r in list_reservations(fetch_raw_state()) if r.name == name]
    if not found:
        return f"no reservation named {name!r} on this cluster"
    info = found[0]
    for pg_id in [*info.head_locks.values(), info.placement_group_id]:
        _ray_private.remove_placement_group_by_id(pg_id)
    return ""


def _command(line: str) -> None:
    from raytpu_lab.train.board import request_stop

    try:
        cmd = json.loads(line)
    except ValueError:
        return
    error = ""
    try:
        if cmd.get("op") == "release":
            error = _release(str(cmd.get("name", "")))
        elif cmd.get("op") == "stop":
            key = str(cmd.get("key", ""))
            error = "" if request_stop(key) else f"no run {key!r} on this cluster"
        else:
            error = f"unknown op {cmd.get('op')!r}"
    except Exception as err:  # reported to the caller, who shows it
        error = f"{type(err).__name__}: {err}"
    _emit({"type": "reply", "id": cmd.get("id"), "ok": not error, "error": error})


def _commands() -> None:
    for line in sys.stdin:
        if line.strip():
            _command(line)
    sys.exit(0)  # the server closed our stdin: it is gone or done with us


def main(argv: list[str] | None = None) -> int:
    """Connect to ``argv[0]`` (a Ray address) and poll every ``argv[1]`` seconds (see module)."""
    args = sys.argv[1:] if argv is None else argv
    address, interval_s = args[0], float(args[1])
    import os

    global _STREAM
    _STREAM = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    from raytpu_lab.cluster.connect import connect
    from raytpu_lab.state.fetch import fetch_placement_group_lifetimes, fetch_raw_state
    from raytpu_lab.train.board import list_runs

    try:
        if address.startswith("kuberay:"):  # "kuberay:NAMESPACE/NAME": resolve (and port-forward)
            from raytpu_lab.kuberay.connect import resolve

            namespace, _, name = address[len("kuberay:"):].rpartition("/")
            address = resolve(name, namespace=namespace or None).address
        from raytpu_lab import _ray_private
        from raytpu_lab.cluster import emulator_state

        if any(c.address == address for c in emulator_state.running()):
            _ray_private.enable_token_auth()  # emulated clusters run with Ray token auth
        connect(address, timeout_s=15.0)
    except Exception as err:
        _emit({"type": "error", "error": f"cannot connect to {address}: {err}", "fatal": True})
        return 1
    parent = os.getppid()
    reader = threading.Thread(target=_commands, name="raytpu-poll-commands", daemon=True)
    reader.start()
    while True:
        start = time.monotonic()
        try:
            _emit({"type": "state", "raw": fetch_raw_state(),
                   "lifetimes": fetch_placement_group_lifetimes(), "runs": list_runs()})
        except Exception as err:
            _emit({"type": "error", "error": f"{type(err).__name__}: {err}"})
        if not reader.is_alive() or os.getppid() != parent:  # the server is gone
            return 0
        time.sleep(max(0.05, interval_s - (time.monotonic() - start)))


if __name__ == "__main__":
    sys.exit(main())
