"""A separate Ray driver for the integration tests: ``python -m tests.integration._driver ACTION ...``.

Tests about drivers that exit, are killed or race each other need real separate driver processes.
Each action connects with :meth:`raytpu_lab.lab.Lab.connect` (which turns on Ray token auth for
emulated clusters found under ``$RAYTPU_EMULATOR_ROOT``), prints one JSON line ``RESULT {...}`` and
then holds what it made for ``--hold-s`` seconds (or until killed) before exiting.

Actions:
    reserve       ``Lab.reserve`` (``--detached`` for a detached reservation).
    bare-detached ``ray.util.tpu.slice_placement_group(..., lifetime="detached")`` as Ray ships it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_REPO = Path(__file__).resolve().parents[2]


def start(action: str, address: str, name: str, *extra: str) -> subprocess.Popen[str]:
    """Start a driver process (inherits ``$RAYTPU_EMULATOR_ROOT`` and the Ray auth setup)."""
    import tempfile

    log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115  # a file, not a pipe: never blocks
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.integration._driver", action, "--address", address,
         "--name", name, *extra],
        cwd=_REPO, env=dict(os.environ), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
        text=True)
    proc.stderr = log  # type: ignore[assignment]  # read back by result() on failure
    return proc


def result(proc: subprocess.Popen[str], timeout_s: float = 60.0) -> dict[str, Any]:
    """Wait for the driver's ``RESULT`` line (the driver may keep running: it holds what it made).

    Lines are read by a thread: Ray forwards worker logs to a driver's stdout, so several lines
    can arrive at once, which ``select`` on the pipe would not see again once buffered.
    """
    import queue
    import threading

    assert proc.stdout is not None
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put("")  # EOF

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line.startswith("RESULT "):
            return dict(json.loads(line[len("RESULT "):]))
        if not line:
            break
    proc.kill()
    err = ""
    if proc.stderr is not None:
        proc.stderr.seek(0)
        err = proc.stderr.read()
    raise AssertionError(f"driver printed no RESULT within {timeout_s} s: {err[-3000:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=["reserve", "bare-detached"])
    parser.add_argument("--address", required=True)
    parser.add_argument("--topology", default="2x2x2")
    parser.add_argument("--version", default="v4")
    parser.add_argument("--name", required=True)
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--detached", action="store_true")
    parser.add_argument("--hold-s", type=float, default=0.0,
                        help="seconds to hold before exiting; -1: until a line on stdin, then "
                             "release and exit")
    parser.add_argument("--start-at", type=float, default=0.0,
                        help="time.time() to start reserving at (lines up concurrent drivers)")
    args = parser.parse_args(argv)

    import ray

    from raytpu_lab.errors import NoSliceAvailableError
    from raytpu_lab.lab import Lab

    lab = Lab()
    lab.connect(args.address)
    if args.start_at:
        time.sleep(max(0.0, args.start_at - time.time()))
    out: dict = {"name": args.name}
    start = time.monotonic()
    if args.action == "reserve":
        try:
            res = lab.reserve(args.topology, args.version, name=args.name, timeout_s=args.timeout,
                              detached=args.detached)
            out.update(ok=True, slices=res.slice_names,
                       head_locks=[pg.id.hex() for pg in res.head_locks],
                       placement_group=res.placement_group.id.hex())
        except NoSliceAvailableError as err:
            out.update(ok=False, error=str(err), reasons=err.reasons, slices_idle=err.slices_idle)
    else:
        from ray.util.tpu import slice_placement_group

        handle = slice_placement_group(args.topology, args.version, name=args.name,
                                       lifetime="detached")
        ray.get(handle.placement_group.ready(), timeout=args.timeout)
        out.update(ok=True, placement_group=handle.placement_group.id.hex(),
                   head_pgs=[pg.id.hex() for pg in handle.head_placement_groups])
    out["elapsed_s"] = round(time.monotonic() - start, 3)
    print("RESULT " + json.dumps(out), flush=True)
    if args.hold_s >= 0:
        time.sleep(args.hold_s)
        return 0
    sys.stdin.readline()
    if out.get("ok") and args.action == "reserve":
        lab.release(args.name)
    print("RELEASED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
