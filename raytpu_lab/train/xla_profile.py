"""PyTorch/XLA profile data of a run, and recompilation storms. Pure: no Ray, no torch.

Each worker sends these as its worker summary when its function ends (see
:func:`raytpu_lab.train.torch_xla_utils.xla_metrics` and ``RunResult.worker_summaries``), read
from ``torch_xla.debug.metrics``:

- ``xla_compile_count`` / ``xla_compile_time_s``: XLA graph compilations (metric ``CompileTime``),
- ``xla_execute_count`` / ``xla_execute_time_s``: graph executions (``ExecuteTime``),
- ``xla_transfer_to_device_count`` / ``..._time_s``, ``xla_transfer_from_device_count`` /
  ``..._time_s``: host <-> device copies (``TransferToDeviceTime`` / ``TransferFromDeviceTime``),
- ``xla_compiles_per_step``: the running compile count after each ``optimizer_step``.

A healthy lazy-tensor loop compiles a few graphs in its first steps, then reuses them. Graphs
that keep changing (a shape that varies per step, a Python scalar baked into the graph) compile
on every step: a *recompilation storm*, which :func:`recompilation_storm` flags.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["CompileTrend", "recompilation_storm", "xla_metrics_by_rank"]


@dataclass(frozen=True)
class CompileTrend:
    """How compiles grew over a run of one worker.

    Attributes:
        steps: Steps observed.
        warmup_steps: Steps counted as warm-up (compiles there are expected).
        warmup_compiles: Compiles up to the end of warm-up.
        later_compiles: Compiles after warm-up.
        late_compiles: Compiles in the last half of the steps after warm-up.
        storm: Compiles still growing after warm-up: at least ``min_compiles`` after it, some of
            them in its last half.
        reason: One sentence for the profiling panel.
    """

    steps: int
    warmup_steps: int
    warmup_compiles: int
    later_compiles: int
    late_compiles: int
    storm: bool
    reason: str


def recompilation_storm(compiles_per_step: Sequence[int], *, warmup_steps: int = 3,
                        min_compiles: int = 2) -> CompileTrend:
    """Flag compiles that keep growing after warm-up.

    Args:
        compiles_per_step: Running compile count after each step (non-decreasing), as the
            workers report it in ``xla_compiles_per_step``.
        warmup_steps: Leading steps whose compiles are expected (first forward/backward, the
            optimizer's first step creating its state).
        min_compiles: Compiles after warm-up needed to call it a storm.

    Returns:
        The trend; ``storm`` is False when there are no steps after warm-up.
    """
    counts = list(compiles_per_step)
    steps = len(counts)
    warm = min(warmup_steps, steps)
    at_warm = counts[warm - 1] if warm else 0
    last = counts[-1] if counts else 0
    later = last - at_warm
    after = counts[warm:]
    half = after[len(after) // 2 - 1] if len(after) >= 2 else at_warm
    late = last - half if after else 0
    storm = later >= min_compiles and late > 0
    if not after:
        reason = f"{steps} step(s), all within the {warmup_steps}-step warm-up."
    elif storm:
        reason = (f"{later} compiles after the {warm}-step warm-up ({late} in the last "
                  f"{len(after) - len(after) // 2} steps): graphs keep changing; look for shapes or "
                  "Python values that vary per step.")
    else:
        reason = f"{at_warm} compiles in warm-up, {later} in the {len(after)} steps after."
    return CompileTrend(steps=steps, warmup_steps=warm, warmup_compiles=at_warm,
                        later_compiles=later, late_compiles=late, storm=storm, reason=reason)


def xla_metrics_by_rank(summaries: Mapping[int, Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
    """``{rank: that rank's torch_xla metrics}`` (its ``xla_*`` keys) from the workers' summaries
    (``RunResult.worker_summaries``), sorted by rank; ranks without them are left out."""
    found = {int(rank): {k: v for k, v in summary.items() if k.startswith("xla_")}
             for rank, summary in summaries.items()}
    return {rank: m for rank, m in sorted(found.items()) if m}
