"""How a starting emulated node is doing, and why one failed (helpers of :mod:`._nodes`).

Read from the node's ``ray start`` log and its raylet's logs: whether the raylet aborted, missed
``ray start``'s fixed 30 s registration window or said it started, which raylet runs in the node's
process group; and, for a node that failed, the error with its log tails and the likely cause.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from raytpu_lab.advice import opt
from raytpu_lab.errors import EmulatorError

if TYPE_CHECKING:
    from raytpu_lab.cluster._nodes import NodeSpec

__all__ = ["aborts", "raylet_aborted", "missed_window", "registered", "raylet_of", "node_error",
           "likely_cause"]

_REGISTRATION_TIMEOUT_MARK = "timed out during startup"


_RAYLET_STARTED = re.compile(r"Raylet of id, [0-9a-f]+ started")



def aborts(spec: NodeSpec) -> int:
    """Raylet aborts (Ray's "Check failed" with a stack trace) logged in the node's temp dir.

    Every launch of a node shares one session name (Ray derives it in the launcher, before the
    fork), so a later attempt's raylet writes ``raylet.1.out`` beside the first one's."""
    temp = next((a.split("=", 1)[1] for a in spec.args if a.startswith("--temp-dir=")), "")
    count = 0
    for out in Path(temp).glob("session_*/logs/raylet*.out") if temp else []:
        try:
            count += out.read_text(errors="replace").count("*** StackTrace Information ***")
        except OSError:
            continue
    return count



def raylet_aborted(spec: NodeSpec) -> bool:
    """Whether this launch's raylet aborted: `ray start` then waits for it forever, so the
    launch is given up at once."""
    return aborts(spec) > spec.aborts_before



def missed_window(folder: Path, spec: NodeSpec) -> bool:
    log = folder / "logs" / f"{spec.label}.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    return _REGISTRATION_TIMEOUT_MARK in text[-3000:]



def registered(spec: NodeSpec) -> bool:
    """Whether the node's raylet says it started (it registered with the GCS just before)."""
    temp = next((a.split("=", 1)[1] for a in spec.args if a.startswith("--temp-dir=")), "")
    out = Path(temp) / "session_latest" / "logs" / "raylet.out"
    try:
        return _RAYLET_STARTED.search(out.read_text(errors="replace")) is not None
    except OSError:
        return False



def raylet_of(pgid: int) -> int:
    """The raylet's pid in a node's process group (0 if none: the node is gone)."""
    for proc in psutil.process_iter(["name"]):
        try:
            if proc.info["name"] == "raylet" and os.getpgid(proc.pid) == pgid:
                return int(proc.pid)
        except (psutil.Error, OSError):
            continue
    return 0



def node_error(folder: Path, spec: NodeSpec, what: str, timed_out: bool = False) -> EmulatorError:
    log = folder / "logs" / f"{spec.label}.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    raylet = _raylet_text(folder, spec)
    tail = "\n".join(text.strip().splitlines()[-12:])
    raylet_tail = "\n".join(line for line in raylet.strip().splitlines()[-6:])
    cause = likely_cause(text + "\n" + raylet)
    why = f"{cause}\nLast lines of {log}:\n{tail}"
    if raylet_tail:
        why += f"\nLast lines of its raylet.out:\n{raylet_tail}"
    return EmulatorError(
        f"Emulated node {spec.label} {what}.", why=why,
        fix=("Pass a longer timeout (", opt("timeout", "SECONDS"), ") or start fewer slices.")
            if timed_out or "busy" in cause else "Fix the cause above and run `up` again.")



def _raylet_text(folder: Path, spec: NodeSpec) -> str:
    temp = next((a.split("=", 1)[1] for a in spec.args if a.startswith("--temp-dir=")), "")
    if not temp:
        return ""
    found = sorted(Path(temp).glob("session_*/logs/raylet.out"), key=lambda p: p.stat().st_mtime)
    return found[-1].read_text(errors="replace")[-20000:] if found else ""



def likely_cause(text: str) -> str:
    """The likely cause of a failed or slow node start, from its logs and the machine's state."""
    load = os.getloadavg()[0]
    cores = os.cpu_count() or 1
    free_gib = psutil.virtual_memory().available / 2**30
    busy = f"(load average {load:.1f} on {cores} cores, {free_gib:.1f} GiB memory free)"
    if "Usage: ray start" in text:
        return "Likely cause: `ray start` refused an argument (see the log below)."
    if "timed out during startup" in text:
        return f"Likely cause: the node missed Ray's fixed 30 s registration window: a busy machine {busy}."
    if "Timed out waiting for file" in text or "dashboard.err" in text \
            or "WaitForDashboardAgentPorts" in text:
        return f"Likely cause: the node's Python agents started too slowly: a busy machine {busy}."
    if "Address already in use" in text or "bind" in text.lower() and "fail" in text.lower():
        return "Likely cause: a port was taken between choosing it and binding it."
    if free_gib < 1.0:
        return f"Likely cause: memory is short {busy}."
    if "Check failed" in text:
        return f"Likely cause: Ray aborted (see the 'Check failed' line); the machine {busy}."
    if load > 2 * cores:
        return f"Likely cause: a busy machine {busy}."
    return f"Machine state: {busy}."
