"""torch_xla's metrics of a PyTorch/XLA run, shown inline after it: per rank, XLA compiles,
executions and host <-> device transfers (count and seconds), and recompilation storms.

Static HTML plus a ``text/plain`` table; pure (no Ray, no torch). The numbers are what each
worker read from ``torch_xla.debug.metrics`` when its function ended (see
:mod:`raytpu_lab.train.xla_profile`).
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any, Protocol

from raytpu_lab.train.xla_profile import CompileTrend

__all__ = ["XlaMetricsView", "TorchRunMetrics", "XLA_COLUMNS"]

XLA_COLUMNS = (("compile", "compiles"), ("execute", "executions"),
               ("transfer_to_device", "to device"), ("transfer_from_device", "from device"))
"""``(metric key part, column title)``: ``xla_<part>_count`` and ``xla_<part>_time_s``."""


class TorchRunMetrics(Protocol):
    """What :meth:`XlaMetricsView.of` reads off a run (``TorchRunResult`` has it)."""

    @property
    def xla_metrics(self) -> Mapping[int, Mapping[str, object]]: ...

    @property
    def chip_placement(self) -> Mapping[int, Mapping[str, object]]: ...

    def compile_trends(self) -> Mapping[int, CompileTrend]: ...


class XlaMetricsView:
    """Display of a run's torch_xla metrics per rank, with recompilation storms flagged.

    Args:
        metrics: ``{rank: {"xla_compile_count", "xla_compile_time_s", ...}}``
            (``TorchRunResult.xla_metrics``).
        trends: ``{rank: CompileTrend}`` (``TorchRunResult.compile_trends()``).
        placement: ``{rank: {"slice", "host", "chip", ...}}`` (``TorchRunResult.chip_placement``),
            to say where each rank ran; optional.

    Example::

        display(XlaMetricsView.of(last_run))
    """

    def __init__(self, metrics: Mapping[int, Mapping[str, object]],
                 trends: Mapping[int, CompileTrend],
                 placement: Mapping[int, Mapping[str, object]] | None = None) -> None:
        self.metrics = dict(metrics)
        self.trends = dict(trends)
        self.placement = dict(placement or {})

    @classmethod
    def of(cls, run: TorchRunMetrics) -> XlaMetricsView:
        """The view of a ``TorchRunResult``."""
        return cls(run.xla_metrics, run.compile_trends(), run.chip_placement)

    @property
    def storm_ranks(self) -> list[int]:
        """Ranks whose compiles kept growing after warm-up."""
        return sorted(r for r, t in self.trends.items() if t.storm)

    def _where(self, rank: int) -> str:
        p = self.placement.get(rank)
        return f"{p.get('slice', '')} host {p.get('host')} chip {p.get('chip')}" if p else ""

    def _cells(self, rank: int) -> list[str]:
        m = self.metrics[rank]
        return [f"{m.get(f'xla_{part}_count', 0)} / {m.get(f'xla_{part}_time_s', 0.0):.3f} s"
                for part, _ in XLA_COLUMNS]

    def headline(self) -> str:
        """One sentence: how many ranks reported, and any storm."""
        if not self.metrics:
            return "No torch_xla metrics: the workers sent none (torch_xla missing, or the run " \
                   "ended before its function did)."
        storms = self.storm_ranks
        if storms:
            first = self.trends[storms[0]]
            return (f"Recompilation storm on rank(s) {', '.join(map(str, storms))}: "
                    f"{first.reason}")
        return f"torch_xla metrics of {len(self.metrics)} ranks; no recompilation storm."

    def text(self) -> str:
        """A plain-text table (``text/plain``)."""
        titles = ["rank", "where"] + [f"{t} (n / s)" for _, t in XLA_COLUMNS] + ["after warm-up"]
        rows = [[str(r), self._where(r), *self._cells(r),
                 _late(self.trends.get(r))] for r in sorted(self.metrics)]
        widths = [max(len(x) for x in col) for col in zip(titles, *rows, strict=False)]
        lines = [self.headline(), "  ".join(t.ljust(w) for t, w in zip(titles, widths, strict=True))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
        return "\n".join(lines)

    def html(self) -> str:
        """The headline and one table row per rank; storm rows in red."""
        head = "".join(f"<th>{escape(t)}<br><small>count / s</small></th>" for _, t in XLA_COLUMNS)
        rows = []
        for r in sorted(self.metrics):
            trend = self.trends.get(r)
            style = " style='color:#d93025;font-weight:bold'" if trend and trend.storm else ""
            title = f" title='{escape(trend.reason, quote=True)}'" if trend else ""
            cells = "".join(f"<td style='text-align:right'>{escape(c)}</td>" for c in self._cells(r))
            rows.append(f"<tr{style}{title}><td>{r}</td><td>{escape(self._where(r))}</td>{cells}"
                        f"<td>{escape(_late(trend))}</td></tr>")
        colour = "#d93025" if self.storm_ranks else "inherit"
        return ("<div class='raytpu-xla' style='font-family:sans-serif;font-size:12px'>"
                "<style>.raytpu-xla th,.raytpu-xla td{padding:2px 8px;text-align:left}</style>"
                f"<b>torch_xla metrics</b> <span style='color:{colour}'>"
                f"{escape(self.headline())}</span>"
                f"<table><tr><th>rank</th><th>where</th>{head}<th>compiles after warm-up</th></tr>"
                f"{''.join(rows)}</table></div>")

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, str]:
        return {"text/plain": self.text(), "text/html": self.html()}


def _late(trend: CompileTrend | None) -> str:
    if trend is None:
        return ""
    flag = " STORM" if trend.storm else ""
    return f"{trend.later_compiles} ({trend.late_compiles} late){flag}"
