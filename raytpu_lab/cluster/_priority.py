"""CPU priority of emulated nodes: raised while a node starts, normal once it registered."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

if TYPE_CHECKING:
    from raytpu_lab.cluster._nodes import NodeSpec

__all__ = ["START_NICE", "normal_priority", "own_autogroup_nice"]

START_NICE = -10
"""CPU priority of a node's processes while it starts (where we may raise it, i.e. as root):
Ray 2.60's raylet aborts when its dashboard agent, a Python process importing Ray, has not
written its port within a fixed ~15 s, which a busy machine makes it miss; once the node has
registered its priority is set back to normal (:func:`normal_priority`)."""



def normal_priority(spec: NodeSpec) -> None:
    """Set a started node's processes back to normal CPU priority (see ``START_NICE``): its
    process group, its raylet's descendants (workers started later inherit the raylet's) and its
    session's autogroup. Normal is the priority of the process starting the cluster (a CI job
    or a user's ``nice make test`` may run above 0), not 0."""
    normal = os.getpriority(os.PRIO_PROCESS, 0)
    with contextlib.suppress(OSError):
        if spec.pgid > 0:
            os.setpriority(os.PRIO_PGRP, spec.pgid, normal)
    if spec.raylet_pid <= 0:
        return
    try:
        raylet = psutil.Process(spec.raylet_pid)
        procs = [raylet, *raylet.children(recursive=True)]
    except psutil.Error:
        return
    for proc in procs:
        with contextlib.suppress(psutil.Error, OSError):
            proc.nice(normal)
    with contextlib.suppress(OSError), open(f"/proc/{spec.raylet_pid}/autogroup", "w") as group:
        group.write(own_autogroup_nice())



def own_autogroup_nice() -> str:
    """This process's autogroup nice ("0" where the kernel has no autogroups)."""
    try:
        return Path("/proc/self/autogroup").read_text().split()[-1]
    except (OSError, IndexError):
        return "0"
