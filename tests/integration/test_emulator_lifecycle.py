"""up/down of a small separate emulated cluster: nothing left behind, names never cross."""

from __future__ import annotations

import psutil

from raytpu_lab.cluster import emulator


def _processes_under(folder: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if any(folder in part for part in p.info["cmdline"] or []):
            found.append(p)
    return found


def test_down_leaves_no_process_and_no_folder(cluster: emulator.EmulatedCluster) -> None:
    small = emulator.up([("v6e:2x2", 1)], name="raytpu-lifecycle")
    folder = str(small.folder)
    try:
        assert small.address != cluster.address
        assert emulator.find("raytpu-lifecycle") is not None
        assert _processes_under(folder)
    finally:
        small.down()
    assert not _processes_under(folder)
    assert emulator.find("raytpu-lifecycle") is None
    assert not small.folder.exists()
    assert emulator.find(cluster.name) is not None, "the other cluster must be untouched"
