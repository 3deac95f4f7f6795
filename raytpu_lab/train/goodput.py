"""Goodput: where a run's wall time went, before, between and after its steps. Pure (no Ray).

The split follows the "badput" buckets of Google's ml-goodput-measurement library (TPU
initialisation, program start-up, data loading, checkpointing, wasted progress), with the
timestamps a Ray Train run gives us. All times are seconds since the run's launch on the driver:

- ``waiting for slices``: launch until the run's placement group held its slices (the driver's
  poll, every 0.25 s) or, if earlier, until the worker process started;
- ``worker start-up``: until rank 0's worker process was created (its ``create_time``);
- ``distributed init``: until the training function started (Ray Train's worker-group setup,
  which calls ``jax.distributed.initialize`` for JAX or sets up the process group for PyTorch);
- ``first step (compile)``: from the function's start to its first ``ray.train.report`` call
  (tracing, XLA compilation and the first step; data loading set-up too);
- ``steps``: from the first report's start to the last report's end, less the time inside
  ``ray.train.report`` — the productive time (goodput);
- ``report``: inside ``ray.train.report`` calls without a checkpoint (they wait for the
  controller to take every rank's report);
- ``checkpointing``: inside ``ray.train.report`` calls with a checkpoint (its upload);
- ``other``: the rest of the wall time (after the last report, the trainer's teardown, and
  any gap not covered above).

The worker tap (:mod:`raytpu_lab.train.worker_tap`) measures rank 0's times in the worker
(epoch seconds, converted here with the driver's launch time; hosts' clocks are assumed in
sync to well under a step, as NTP keeps them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["GOODPUT_PARTS", "Goodput", "split_goodput"]

GOODPUT_PARTS = ("waiting for slices", "worker start-up", "distributed init",
                 "first step (compile)", "steps", "report", "checkpointing", "other")
"""The parts of :class:`Goodput`, in time order (``steps`` is the productive part)."""


@dataclass(frozen=True)
class Goodput:
    """A run's wall time split into :data:`GOODPUT_PARTS`.

    Attributes:
        wall_s: Seconds from launch to the end of ``fit()``.
        parts: ``{part: seconds}`` for every part of :data:`GOODPUT_PARTS`, in that order; each
            is >= 0 and together they make ``wall_s`` (``other`` takes the remainder).
        measured: Whether the worker's timestamps arrived (else everything is ``other``).
    """

    wall_s: float
    parts: Mapping[str, float]
    measured: bool = True

    @property
    def productive_s(self) -> float:
        """Seconds of productive steps."""
        return float(self.parts.get("steps", 0.0))

    @property
    def fraction(self) -> float:
        """Goodput: productive seconds over wall seconds (0.0 for a zero wall time)."""
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def badput(self) -> dict[str, float]:
        """The parts that are not productive steps, largest first (seconds)."""
        return dict(sorted(((k, v) for k, v in self.parts.items() if k != "steps"),
                           key=lambda kv: -kv[1]))

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: ``{"wall_s", "fraction", "measured", "parts": {part: seconds}}``."""
        return {"wall_s": round(self.wall_s, 3), "fraction": round(self.fraction, 4),
                "measured": self.measured,
                "parts": {k: round(v, 3) for k, v in self.parts.items()}}

    def text(self) -> str:
        """One line: goodput percent, then each non-zero part with its seconds and share."""
        if self.wall_s <= 0:
            return "goodput: no wall time yet"
        shown = ", ".join(f"{k} {v:.1f} s ({v / self.wall_s:.0%})"
                          for k, v in self.parts.items() if v >= 0.05)
        note = "" if self.measured else " (no worker timestamps: all counted as other)"
        return f"goodput {self.fraction:.0%} of {self.wall_s:.1f} s: {shown}{note}"

    def __repr__(self) -> str:
        return f"Goodput({self.text()})"


def split_goodput(wall_s: float, *, placed_s: float | None, process_start_s: float | None,
                  fn_start_s: float | None, fn_end_s: float | None,
                  reports: Sequence[tuple[float, float, bool]] = ()) -> Goodput:
    """Split ``wall_s`` into :data:`GOODPUT_PARTS` from one rank's timestamps.

    Args:
        wall_s: Seconds from launch to the end of ``fit()``.
        placed_s: When the run's slices were seen held (``None``: not seen).
        process_start_s: When the worker process was created (may be before launch for a
            process Ray started earlier; then it counts as no start-up time).
        fn_start_s: When the training function was called (``None``: no worker timestamps;
            everything is ``other``).
        fn_end_s: When it returned or raised (``None``: it did not end, e.g. a stop).
        reports: ``(start, end, with_checkpoint)`` of each ``ray.train.report`` call.

    All times are seconds since launch. Times are clamped into ``[0, wall_s]`` and made
    monotonic, so a clock skew or a late poll never gives a negative part.

    Returns:
        The :class:`Goodput`.
    """
    wall_s = max(float(wall_s), 0.0)
    parts = dict.fromkeys(GOODPUT_PARTS, 0.0)
    if fn_start_s is None:
        parts["other"] = wall_s
        return Goodput(wall_s, parts, measured=False)

    def clamp(t: float, lo: float = 0.0) -> float:
        return min(max(t, lo), wall_s)

    fn_start = clamp(fn_start_s)
    started = clamp(process_start_s if process_start_s is not None else fn_start, 0.0)
    started = min(started, fn_start)
    placed = clamp(placed_s if placed_s is not None else started)
    placed = min(placed, started) if started > 0 else min(placed, fn_start)
    parts["waiting for slices"] = placed
    parts["worker start-up"] = max(started - placed, 0.0)
    parts["distributed init"] = fn_start - max(started, placed)
    spans = sorted((clamp(s, fn_start), clamp(e, fn_start), bool(c)) for s, e, c in reports)
    if spans:
        first, last = spans[0][0], max(e for _, e, _ in spans)
        inside = [max(e - s, 0.0) for s, e, _ in spans]
        parts["first step (compile)"] = first - fn_start
        parts["report"] = sum(d for d, (_, _, c) in zip(inside, spans, strict=True) if not c)
        parts["checkpointing"] = sum(d for d, (_, _, c) in zip(inside, spans, strict=True) if c)
        parts["steps"] = max(last - first - sum(inside), 0.0)
    else:
        end = clamp(fn_end_s if fn_end_s is not None else wall_s, fn_start)
        parts["first step (compile)"] = end - fn_start
    parts["other"] = max(wall_s - sum(v for k, v in parts.items() if k != "other"), 0.0)
    return Goodput(wall_s, parts)
