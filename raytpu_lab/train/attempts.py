"""A restarted run's attempts (one per worker group Ray Train started), from what its result
holds. Pure: no Ray.

Ray Train restarts a run whose worker group failed (``FailureConfig(max_failures=N)``): each
restart is reported by the controller (a :class:`~raytpu_lab.train.protocols.RestartRow` in the
result), and the new group's placement rows and reports carry ``"attempt": n``. From these,
:func:`attempt_rows` says for each attempt where it ran (slices, hosts, the ``MEGASCALE_*`` values
each rank saw), why it ended (which rank, host and slice failed, with Ray's error) and the time
the failure cost.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from raytpu_lab.train.protocols import AttemptRow, PlacementRow, Record, RestartRow

__all__ = ["attempt_of", "attempt_rows", "restart_lines"]


def attempt_of(row: Any) -> int:
    """The attempt a record or placement row belongs to (0 when it says none)."""
    return int(row.get("attempt", 0) or 0)


def attempt_rows(restarts: Sequence[RestartRow], workers: Sequence[PlacementRow],
                 records: Sequence[Record], *, wall_s: float, ended: str | None) -> list[AttemptRow]:
    """One row per attempt, in order (see :class:`~raytpu_lab.train.protocols.AttemptRow`).

    Args:
        restarts: The controller's restarts, in order (attempt ``i`` ended at ``restarts[i]``).
        workers: Every placement row of the run.
        records: Every report of the run.
        wall_s: Seconds from launch to the end of ``fit()`` (0 while running).
        ended: The run's end (``"finished"``, ``"failed"``, ``"stopped"``), ``None`` while it runs.
    """
    first_report: dict[int, float] = {}
    for r in records:
        first_report.setdefault(attempt_of(r), float(r.get("time_s", 0.0)))
    rows: list[AttemptRow] = []
    for i in range(len(restarts) + 1):
        mine = _latest_per_rank([w for w in workers if attempt_of(w) == i])
        started = 0.0 if i == 0 else float(restarts[i - 1]["at_s"])
        restarted = i < len(restarts)
        errors = restarts[i]["errors"] if restarted else {}
        failed = sorted(int(k) for k in errors)
        where = {int(w["rank"]): w for w in mine}
        failed_hosts = sorted({where[k]["host"] for k in failed if k in where})
        failed_slices = sorted({where[k]["slice"] for k in failed if k in where and where[k]["slice"]})
        nxt = first_report.get(i + 1)
        rows.append({
            "attempt": i, "started_s": round(started, 2),
            "ended_s": round(float(restarts[i]["at_s"]), 2) if restarted else (
                round(wall_s, 2) if ended else None),
            "outcome": "restarted" if restarted else ended or "running",  # type: ignore[typeddict-item]
            "slices": sorted({w["slice"] for w in mine if w["slice"]}),
            "hosts": [w["host"] for w in mine],
            "failed_ranks": failed, "failed_hosts": failed_hosts, "failed_slices": failed_slices,
            "cause": _cause(restarts[i], failed, where) if restarted else "",
            "lost_s": round(nxt - started, 2) if restarted and nxt is not None else None,
            "megascale": [{"rank": w["rank"], "slice": w["slice"], "host": w["host"],
                           "slice_id": w.get("megascale_slice_id"),
                           "num_slices": w.get("megascale_num_slices"),
                           "coordinator": w.get("megascale_coordinator_address")}
                          for w in mine],
        })
    return rows


def restart_lines(rows: Sequence[AttemptRow]) -> list[str]:
    """One line per restart: ``attempt 0 -> 1 at 12.3 s: <cause>; 8.1 s lost``."""
    out = []
    for a in rows:
        if a["outcome"] != "restarted":
            continue
        lost = f"; {a['lost_s']:.1f} s lost" if a["lost_s"] is not None else "; not yet resumed"
        out.append(f"attempt {a['attempt']} -> {a['attempt'] + 1} at {a['ended_s']:.1f} s: "
                   f"{a['cause']}{lost}")
    return out


def _latest_per_rank(rows: list[PlacementRow]) -> list[PlacementRow]:
    latest: dict[int, PlacementRow] = {}
    for w in rows:
        latest[int(w["rank"])] = w
    return [latest[k] for k in sorted(latest)]


def _cause(restart: RestartRow, failed: list[int], where: dict[int, PlacementRow]) -> str:
    parts = []
    for rank in failed:
        w = where.get(rank)
        at = (f" on host {w['host']}" + (f" ({w['slice']} worker {w['worker_id']})"
                                          if w["slice"] else "")) if w is not None else ""
        text = str(restart["errors"].get(rank, "")).splitlines()
        parts.append(f"rank {rank}{at} failed: {text[0] if text else 'no error text'}")
    return "; ".join(parts) or (restart["error"].splitlines() or ["worker group failed"])[0]
