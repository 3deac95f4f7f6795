"""Pure helpers for what a run streams: capped per-worker logs, a redraw throttle, the placement
table. No Ray, no IPython: the drain thread and the dashboard both use them, and unit tests run
them on plain data.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LogBook", "Throttle", "downsample", "metric_series", "numeric_keys", "placement_table",
           "PLACEMENT_COLUMNS"]

#: Columns of :func:`placement_table`, in order.
PLACEMENT_COLUMNS = ("rank", "slice", "worker_id", "host", "node_id", "chips", "megascale_slice_id",
                     "pid")


@dataclass
class _WorkerLog:
    lines: deque[tuple[float, str, str]]
    total: int = 0
    dropped: int = 0


@dataclass
class LogBook:
    """The last ``max_lines`` lines of each worker (rank); older lines are counted, not kept.

    Memory stays at ``ranks x max_lines`` lines however long or loud a run is.

    Args:
        max_lines: Lines kept per rank.
    """

    max_lines: int = 1000
    _workers: dict[int, _WorkerLog] = field(default_factory=dict)
    _revision: dict[int, int] = field(default_factory=dict)

    def add(self, rank: int, lines: Iterable[tuple[str, str]], *, dropped: int = 0,
            time_s: float = 0.0) -> None:
        """Append ``(stream, text)`` lines of ``rank``; ``dropped`` lines never reached us."""
        log = self._workers.get(rank)
        if log is None:
            log = self._workers[rank] = _WorkerLog(deque(maxlen=self.max_lines))
        before = len(log.lines)
        count = 0
        for stream, text in lines:
            log.lines.append((time_s, stream, text))
            count += 1
        overflow = max(0, before + count - self.max_lines)
        log.total += count + dropped
        log.dropped += dropped + overflow
        self._revision[rank] = self._revision.get(rank, 0) + 1

    @property
    def ranks(self) -> list[int]:
        """Ranks that logged anything, sorted."""
        return sorted(self._workers)

    def revision(self, rank: int) -> int:
        """A counter that changes whenever ``rank`` gets lines (to skip redrawing unchanged panes)."""
        return self._revision.get(rank, 0)

    def tail(self, rank: int, n: int | None = None) -> list[tuple[str, str]]:
        """The last ``n`` (default all kept) ``(stream, text)`` lines of ``rank``."""
        log = self._workers.get(rank)
        if log is None:
            return []
        rows = list(log.lines)
        rows = rows[-n:] if n is not None else rows
        return [(stream, text) for _, stream, text in rows]

    def counts(self, rank: int) -> tuple[int, int]:
        """``(lines seen, lines not kept)`` for ``rank``."""
        log = self._workers.get(rank)
        return (log.total, log.dropped) if log else (0, 0)

    def records(self) -> list[dict[str, Any]]:
        """Every kept line as ``{"rank", "stream", "time", "line"}`` (pandas-friendly)."""
        return [{"rank": r, "stream": s, "time": t, "line": text}
                for r in self.ranks for t, s, text in self._workers[r].lines]


class Throttle:
    """Lets an action through at most once per ``interval_s`` seconds.

    Args:
        interval_s: Minimum seconds between two allowed actions.
        clock: Monotonic clock, seconds (injectable for tests).
    """

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._last: float | None = None

    def ready(self) -> bool:
        """True (and starts a new interval) if the last allowed action is ``interval_s`` old."""
        now = self._clock()
        if self._last is None or now - self._last >= self.interval_s:
            self._last = now
            return True
        return False


def placement_table(workers: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Placement rows (one per rank, as the worker tap sends them) -> table rows sorted by rank.

    Each row has :data:`PLACEMENT_COLUMNS`; ``chips`` becomes a comma-separated string and
    ``node_id`` keeps its first 12 hex digits (as Ray's dashboard shows it). A rank seen twice (a
    worker group restarted by Ray Train) keeps its latest row.
    """
    latest: dict[int, Mapping[str, Any]] = {}
    for w in workers:
        latest[int(w["rank"])] = w
    rows = []
    for rank in sorted(latest):
        w = latest[rank]
        rows.append({
            "rank": rank, "slice": w.get("slice") or "", "worker_id": w.get("worker_id"),
            "host": w.get("host") or "", "node_id": (w.get("node_id") or "")[:12],
            "chips": ",".join(str(c) for c in w.get("chips") or []),
            "megascale_slice_id": w.get("megascale_slice_id"), "pid": w.get("pid")})
    return rows


_META_KEYS = ("report", "rank", "time_s", "attempt")


def numeric_keys(records: Iterable[dict[str, Any]]) -> list[str]:
    """Metric keys with a number (not bool) in any record, in first-seen order; ``step`` last."""
    seen: dict[str, None] = {}
    for r in records:
        for k, v in r.items():
            if k not in _META_KEYS and isinstance(v, int | float) and not isinstance(v, bool):
                seen.setdefault(k, None)
    keys = [k for k in seen if k != "step"]
    return keys + (["step"] if "step" in seen else [])


def metric_series(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """One rank's ``(x, y)`` for ``key``: x is ``step`` (else the report index).

    Two keys are derived when not reported: ``step_time_s`` (seconds per step between
    consecutive reports, from the controller's receive times) and ``steps_per_s`` (its inverse).
    """
    xs: list[float] = []
    ys: list[float] = []
    prev: dict[str, Any] | None = None
    for r in rows:
        x = r.get("step", r.get("report", len(xs)))
        y = r.get(key)
        if y is None and key in ("step_time_s", "steps_per_s") and prev is not None:
            dstep = float(x) - float(prev.get("step", prev.get("report", 0)))
            dt = float(r.get("time_s", 0.0)) - float(prev.get("time_s", 0.0))
            if dstep > 0 and dt > 0:
                y = dt / dstep if key == "step_time_s" else dstep / dt
        prev = r
        if isinstance(y, int | float) and not isinstance(y, bool):
            xs.append(float(x))
            ys.append(float(y))
    return xs, ys


def downsample(xs: list[float], ys: list[float], max_points: int) -> tuple[list[float], list[float]]:
    """At most ``max_points`` evenly strided points, always keeping the last one."""
    n = len(xs)
    if n <= max_points or max_points < 2:
        return xs, ys
    stride = -(-n // (max_points - 1))  # ceil
    idx = list(range(0, n - 1, stride)) + [n - 1]
    return [xs[i] for i in idx], [ys[i] for i in idx]
