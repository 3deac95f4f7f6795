"""Read a profiled run's traces from its storage and convert them with XProf.

For every rank folder under ``<run storage>/profile`` (written by
:mod:`raytpu_lab.train.profile`): read ``steps.json`` and convert the rank's ``.xplane.pb`` offline
with ``xprof.convert.raw_to_tool_data.xspace_to_tool_data(files, tool, {})`` (the converter behind
XProf and TensorBoard's profile plugin; no server, no TensorFlow) into the ``trace_viewer`` and
``hlo_stats`` tools, then analyse them (:func:`raytpu_lab.train.profile_analysis.build_report`).
XProf caches its intermediate ``*.op_stats*.pb`` beside the trace, as it does when serving it.

Remote storage (``gs://...``) is copied to a local temporary folder first with ``pyarrow.fs``.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from raytpu_lab.train.profile import PROFILE_DIR, STEPS_FILE
from raytpu_lab.train.profile_analysis import HostTrace, ProfileReport, build_report

__all__ = ["load_profile", "read_host", "xprof_tool"]


def xprof_tool(xplane_files: list[str], tool: str) -> Any:
    """One XProf tool's output for these ``.xplane.pb`` files, parsed from JSON (``{}`` if the
    tool returns nothing).

    Raises:
        ImportError: ``xprof`` is not installed (``pip install xprof``).
    """
    # XProf's C++ side logs ~100 INFO/WARNING lines per conversion straight to fd 2, which a
    # notebook shows in the cell; its level is read once, at import.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from xprof.convert import raw_to_tool_data

    with _quiet_fd2():
        data = raw_to_tool_data.xspace_to_tool_data(xplane_files, tool, {})
    raw = data[0] if isinstance(data, tuple) else data
    if not raw:
        return {}
    return json.loads(raw)


def read_host(rank_dir: Path) -> HostTrace:
    """One rank's ``steps.json`` and converted trace (``trace_viewer``, ``hlo_stats``)."""
    meta = json.loads((rank_dir / STEPS_FILE).read_text())
    xplanes = sorted(str(p) for p in rank_dir.glob("plugins/profile/*/*.xplane.pb"))
    trace: dict[str, Any] = {}
    hlo: dict[str, Any] = {}
    if xplanes:
        latest = [p for p in xplanes if Path(p).parent == Path(xplanes[-1]).parent]
        trace = xprof_tool(latest, "trace_viewer")
        stats = xprof_tool(latest, "hlo_stats")
        hlo = stats if isinstance(stats, dict) else {}
    return HostTrace(meta=meta, trace=trace, hlo_stats=hlo, logdir=str(rank_dir))


def load_profile(run_path: str, window: tuple[int, int], *, top_n: int = 10) -> ProfileReport:
    """Analyse the profile of the run stored at ``run_path`` (Ray Train's ``Result.path``).

    Args:
        run_path: The run's storage directory, local or a ``pyarrow`` URI (``gs://...``).
        window: ``(start, stop)`` steps the run was asked to trace.
        top_n: XLA ops to keep.

    Returns:
        The report; with no rank folder at all, an empty report whose ``message`` says so.
    """
    profile_dir = f"{run_path.rstrip('/')}/{PROFILE_DIR}"
    local = Path(profile_dir) if "://" not in profile_dir else _download(profile_dir)
    ranks = sorted(p for p in local.glob("*") if (p / STEPS_FILE).is_file()) if local.is_dir() else []
    return build_report([read_host(p) for p in ranks], window, profile_dir, top_n=top_n)


def _download(uri: str) -> Path:
    import pyarrow.fs

    target = Path(tempfile.mkdtemp(prefix="raytpu-profile-"))
    fs, path = pyarrow.fs.FileSystem.from_uri(uri)
    if fs.get_file_info(path).type == pyarrow.fs.FileType.NotFound:
        return target
    pyarrow.fs.copy_files(path, os.fspath(target), source_filesystem=fs,
                          destination_filesystem=pyarrow.fs.LocalFileSystem())
    return target


@contextlib.contextmanager
def _quiet_fd2() -> Iterator[None]:
    """Send fd 2 (C++ logging) to /dev/null for the block; Python's ``sys.stderr`` is untouched."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
