"""What a profiled run's traces say, per host: pure functions over the profiler's own outputs.

Inputs, per rank (:class:`HostTrace`): the ``steps.json`` the worker wrote
(:mod:`raytpu_lab.train.profile`) and two outputs of XProf's converter
(``xprof.convert.raw_to_tool_data.xspace_to_tool_data``) for that rank's ``.xplane.pb``:
``trace_viewer`` (Chrome trace-event JSON: ``{"traceEvents": [...]}``, times in microseconds) and
``hlo_stats`` (a DataTable: ``{"cols": [...], "rows": [{"c": [{"v": ...}]}]}``).

Facts this rests on (checked on JAX 0.10 / xprof 2.24, CPU and the XProf docs):

- each traced step is one ``"train <k>"`` event with ``args.step_num`` (our
  ``StepTraceAnnotation``); each report one ``"ray.train.report"`` event;
- every XLA compilation is a ``"backend_compile_and_load"`` event (JAX's
  ``@profiler.annotate_function`` on ``jax._src.compiler.backend_compile_and_load``);
- every executed XLA op is an event whose ``args`` carry ``hlo_op`` and ``hlo_module`` (XLA:CPU
  thunks on the ``XLAPjRtCpuClient`` threads); on TPU, ops run on ``/device:TPU:<n>`` processes;
- XProf's ``hlo_stats`` table has XLA op rows only for device planes (TPU/GPU): on CPU it is
  empty, and the op table is then built from the trace events above.

No Ray, no I/O: :mod:`raytpu_lab.train.profile_load` reads files and calls XProf.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "HostTrace", "StepBreakdown", "OpStat", "CompileStat", "ProfileReport",
    "step_breakdown", "top_ops", "hlo_stats_ops", "compile_stats", "skew_matrix",
    "window_message", "build_report", "open_command",
]

COMPILE_EVENT = "backend_compile_and_load"
REPORT_EVENT = "ray.train.report"
STEP_PREFIX = "train "


@dataclass
class HostTrace:
    """One rank's profile: its ``steps.json`` and XProf's tool outputs for its trace.

    Attributes:
        meta: ``steps.json``: ``rank``, ``slice_name``, ``worker_id``, ``window``, ``reports``,
            ``traced_steps``, ``steps`` (``[{"step", "busy_s", "report_s"}]``), ``compiles``
            (``[{"step", "fun_name", "duration_s"}]``), ``error``.
        trace: XProf ``trace_viewer`` output (``{"traceEvents": [...]}``), or ``{}`` if none.
        hlo_stats: XProf ``hlo_stats`` output, or ``{}``.
        logdir: The rank's trace folder (an XProf/TensorBoard log dir).
    """

    meta: dict[str, Any]
    trace: dict[str, Any] = field(default_factory=dict)
    hlo_stats: dict[str, Any] = field(default_factory=dict)
    logdir: str = ""

    @property
    def rank(self) -> int:
        return int(self.meta.get("rank", 0))

    @property
    def label(self) -> str:
        """``"<slice> w<worker id> (rank r)"``: where the rank ran."""
        return f"{self.meta.get('slice_name') or '?'} w{self.meta.get('worker_id', '?')} (rank {self.rank})"


@dataclass(frozen=True)
class StepBreakdown:
    """Where one traced step of one host went, seconds. The parts add up to ``step_s``.

    ``compile_s``: XLA compilation; ``execute_s``: XLA ops running (outside compile and report);
    ``report_s``: blocked in ``ray.train.report`` (waiting for the other ranks and Ray Train);
    ``host_s``: the rest: Python, input data, dispatch.
    """

    rank: int
    host: str
    step: int
    step_s: float
    compile_s: float
    execute_s: float
    report_s: float
    host_s: float


@dataclass(frozen=True)
class OpStat:
    """An XLA op's time on one host (or all, ``host == "all"``), seconds; self time excludes
    nested ops."""

    host: str
    name: str
    module: str
    occurrences: int
    self_s: float
    total_s: float


@dataclass(frozen=True)
class CompileStat:
    """Compilations of one jitted function across the run (JAX's compile log) on any rank.

    ``recompiles`` is ``max over ranks of (compilations - 1)``: above 0 the function was compiled
    again, usually for new input shapes, dtypes or static arguments.
    """

    fun_name: str
    compiles_per_rank: int
    recompiles: int
    steps: tuple[int, ...]
    total_s: float


def _x_events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"]


def _process_names(trace: dict[str, Any]) -> dict[Any, str]:
    return {e.get("pid"): str(e.get("args", {}).get("name", "")) for e in trace.get("traceEvents", [])
            if isinstance(e, dict) and e.get("ph") == "M" and e.get("name") == "process_name"}


def _is_op(e: dict[str, Any], device_pids: set[Any]) -> bool:
    return "hlo_op" in e.get("args", {}) or e.get("pid") in device_pids


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _clip(intervals: Iterable[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    return [(max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi]


def _length(intervals: Iterable[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def _minus(base: list[tuple[float, float]], cut: list[tuple[float, float]]) -> float:
    """Length of ``base`` (disjoint, sorted) not covered by ``cut`` (disjoint, sorted)."""
    return _length(base) - sum(_length(_clip(cut, a, b)) for a, b in base)


def step_breakdown(host: HostTrace) -> list[StepBreakdown]:
    """Per traced step of one host: compile / execute / report / host time (see
    :class:`StepBreakdown`), from the step, compile, report and XLA op events of its trace."""
    events = _x_events(host.trace)
    device_pids = {p for p, n in _process_names(host.trace).items() if n.startswith("/device:")}

    def span(e: dict[str, Any]) -> tuple[float, float]:
        return float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))

    steps = [e for e in events if str(e.get("name", "")).startswith(STEP_PREFIX)
             and "step_num" in e.get("args", {})]
    compiles = _union(span(e) for e in events if e.get("name") == COMPILE_EVENT)
    reports = _union(span(e) for e in events if e.get("name") == REPORT_EVENT)
    ops = _union(span(e) for e in events if _is_op(e, device_pids))
    out = []
    for e in sorted(steps, key=lambda e: float(e["ts"])):
        lo, hi = span(e)
        step_us = hi - lo
        comp = _clip(compiles, lo, hi)
        rep = _clip(reports, lo, hi)
        compile_us = _length(comp)
        report_us = _minus(rep, comp)
        execute_us = _minus(_clip(ops, lo, hi), _union(comp + rep))
        host_us = max(0.0, step_us - compile_us - report_us - execute_us)
        out.append(StepBreakdown(host.rank, host.label, int(e["args"]["step_num"]), step_us / 1e6,
                                 compile_us / 1e6, execute_us / 1e6, report_us / 1e6,
                                 host_us / 1e6))
    return out


def top_ops(host: HostTrace, n: int = 10) -> list[OpStat]:
    """The ``n`` XLA ops of one host with the most self time, from its trace events.

    Self time: an op event's duration less the ops nested in it on the same thread. Events are
    grouped by ``hlo_module`` and ``hlo_op`` (device-plane events by name).
    """
    device_pids = {p for p, n_ in _process_names(host.trace).items() if n_.startswith("/device:")}
    by_thread: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for e in _x_events(host.trace):
        if _is_op(e, device_pids):
            by_thread[(e.get("pid"), e.get("tid"))].append(e)
    seen: list[tuple[tuple[str, str], float, list[float]]] = []  # (op key, duration, [self])
    for evs in by_thread.values():
        evs.sort(key=lambda e: (float(e["ts"]), -float(e.get("dur", 0.0))))
        stack: list[tuple[float, list[float]]] = []  # (end, [self time]) of the open ops
        for e in evs:
            start, dur = float(e["ts"]), float(e.get("dur", 0.0))
            while stack and stack[-1][0] <= start:
                stack.pop()
            if stack:
                stack[-1][1][0] -= dur  # the parent's self time excludes this op
            args = e.get("args", {})
            own = [dur]
            seen.append(((str(args.get("hlo_op", e.get("name", "?"))),
                          str(args.get("hlo_module", ""))), dur, own))
            stack.append((start + dur, own))
    agg: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for key, dur, own in seen:
        rec = agg[key]
        rec[0] += 1
        rec[1] += max(0.0, own[0])
        rec[2] += dur
    stats = [OpStat(host.label, name, module, int(r[0]), r[1] / 1e6, r[2] / 1e6)
             for (name, module), r in agg.items()]
    return sorted(stats, key=lambda s: -s.self_s)[:n]


def hlo_stats_ops(host: HostTrace, n: int = 10) -> list[OpStat]:
    """The ``n`` XLA ops with the most self time from XProf's ``hlo_stats`` table (device planes:
    TPU/GPU); ``[]`` when the table is empty (CPU)."""
    table = host.hlo_stats if isinstance(host.hlo_stats, dict) else {}
    cols = [c.get("id") for c in table.get("cols", [])]
    needed = {"hlo_op_name", "occurrences", "total_self_time", "total_time"}
    if not needed <= set(cols):
        return []
    out = []
    for row in table.get("rows", []):
        v = dict(zip(cols, (c.get("v") if isinstance(c, dict) else None for c in row.get("c", [])),
                     strict=False))
        out.append(OpStat(host.label, str(v["hlo_op_name"]), str(v.get("program_id") or ""),
                          int(v["occurrences"] or 0), float(v["total_self_time"] or 0) / 1e6,
                          float(v["total_time"] or 0) / 1e6))  # XProf reports microseconds
    return sorted(out, key=lambda s: -s.self_s)[:n]


def compile_stats(hosts: list[HostTrace]) -> list[CompileStat]:
    """Compilations per jitted function over the whole run, from every rank's JAX compile log
    (``steps.json`` ``compiles``), most recompiled first."""
    per_fn: dict[str, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for h in hosts:
        for c in h.meta.get("compiles", []):
            per_fn[str(c.get("fun_name", "?"))][h.rank].append(c)
    out = []
    for fn, ranks in per_fn.items():
        counts = [len(v) for v in ranks.values()]
        steps = sorted({int(c.get("step", 0)) for v in ranks.values() for c in v})
        total = sum(float(c.get("duration_s", 0.0)) for v in ranks.values() for c in v) / len(ranks)
        out.append(CompileStat(fn, max(counts), max(counts) - 1, tuple(steps), total))
    return sorted(out, key=lambda s: (-s.recompiles, -s.total_s))


def skew_matrix(hosts: list[HostTrace]) -> tuple[list[str], list[int], list[list[float | None]]]:
    """Per host and step, how much longer than the median host it worked before reporting.

    ``busy_s`` (time from the previous report's return to this report) is the host's own work;
    the time it then waits in ``ray.train.report`` is the others catching up. A straggler has a
    large positive skew; the rest wait for it.

    Returns:
        ``(host labels by rank, steps, skew_s[host][step])`` in seconds; ``None`` where a host
        has no timing for a step.
    """
    hosts = sorted(hosts, key=lambda h: h.rank)
    busy = [{int(s["step"]): float(s["busy_s"]) for s in h.meta.get("steps", [])} for h in hosts]
    steps = sorted({k for b in busy for k in b})
    medians = {k: statistics.median([b[k] for b in busy if k in b]) for k in steps}
    matrix = [[(b[k] - medians[k]) if k in b else None for k in steps] for b in busy]
    return [h.label for h in hosts], steps, matrix


def window_message(window: tuple[int, int], reports: int) -> str | None:
    """What to say when the run did not cover the window; ``None`` when it did.

    Args:
        window: ``(start, stop)`` steps asked for.
        reports: Reports made by the worker that reported most (steps the run reached).
    """
    start, stop = window
    if reports <= start:
        return (f"profile window {start}:{stop} never reached: the run reported {reports} "
                f"step{'' if reports == 1 else 's'}")
    if reports < stop:
        return (f"profile window {start}:{stop} cut short: the run reported {reports} steps, so "
                f"steps {start}..{reports - 1} were traced")
    return None


def open_command(logdir: str) -> str:
    """The one-liner that serves the traces in XProf (``pip install xprof``; each rank folder is
    one run). TensorBoard with its profile plugin reads the same log dir:
    ``tensorboard --logdir ...``."""
    return f"xprof server --logdir {logdir} --port 8791"


@dataclass
class ProfileReport:
    """Everything the profile view shows for one run.

    Attributes:
        window: ``(start, stop)`` steps asked for.
        logdir: ``<run storage>/profile`` (one XProf log dir per rank below it).
        hosts: Host labels by rank.
        breakdown: Per host and traced step (:class:`StepBreakdown`).
        skew_hosts, skew_steps, skew_s: :func:`skew_matrix`.
        ops: Top XLA ops of all hosts together (summed over hosts).
        ops_source: ``"xprof hlo_stats"`` or ``"trace events"``.
        compiles: :func:`compile_stats`.
        trace_compiles: Compilations inside the traced window, per host (trace events).
        message: :func:`window_message`, or worker-side profiler errors; ``None`` when all went
            as asked.
        slots: ``(slice name, worker id)`` of each host, in the order of ``skew_hosts``.
    """

    window: tuple[int, int]
    logdir: str
    hosts: list[str]
    breakdown: list[StepBreakdown]
    skew_hosts: list[str]
    skew_steps: list[int]
    skew_s: list[list[float | None]]
    ops: list[OpStat]
    ops_source: str
    compiles: list[CompileStat]
    trace_compiles: dict[str, int]
    message: str | None
    slots: list[tuple[str, int]] = field(default_factory=list)

    @property
    def open_command(self) -> str:
        """Shell one-liner opening the traces in XProf."""
        return open_command(self.logdir)

    def host_totals(self) -> list[dict[str, Any]]:
        """Per host: the breakdown summed over traced steps (seconds), for a stacked bar."""
        out: dict[str, dict[str, Any]] = {}
        for b in self.breakdown:
            row = out.setdefault(b.host, {"host": b.host, "rank": b.rank, "steps": 0,
                                          "step_s": 0.0, "compile_s": 0.0, "execute_s": 0.0,
                                          "report_s": 0.0, "host_s": 0.0})
            row["steps"] += 1
            for k in ("step_s", "compile_s", "execute_s", "report_s", "host_s"):
                row[k] += getattr(b, k)
        return sorted(out.values(), key=lambda r: r["rank"])

    def host_skew_s(self) -> dict[tuple[str, int], float]:
        """``{(slice name, worker id): seconds}``: each host's skew summed over the steps where it
        was slower than the median host (0 for a host never slower)."""
        return {slot: sum(v for v in row if v is not None and v > 0)
                for slot, row in zip(self.slots, self.skew_s, strict=True)}

    def straggler(self) -> str | None:
        """The host with the largest total positive skew, if any host is more than 10 ms slower."""
        totals = [(sum(v for v in row if v is not None and v > 0), h)
                  for h, row in zip(self.skew_hosts, self.skew_s, strict=True)]
        if not totals:
            return None
        worst = max(totals)
        return worst[1] if worst[0] > 0.01 else None


def build_report(hosts: list[HostTrace], window: tuple[int, int], logdir: str, *,
                 top_n: int = 10) -> ProfileReport:
    """Analyse every rank's profile into one :class:`ProfileReport`."""
    hosts = sorted(hosts, key=lambda h: h.rank)
    breakdown = [b for h in hosts for b in step_breakdown(h)]
    device_ops = [op for h in hosts for op in hlo_stats_ops(h, n=10_000)]
    source = "xprof hlo_stats" if device_ops else "trace events"
    per_host = device_ops or [op for h in hosts for op in top_ops(h, n=10_000)]
    merged: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for op in per_host:
        m = merged[(op.name, op.module)]
        m[0] += op.occurrences
        m[1] += op.self_s
        m[2] += op.total_s
    ops = sorted((OpStat("all", n, mod, int(m[0]), m[1], m[2]) for (n, mod), m in merged.items()),
                 key=lambda s: -s.self_s)[:top_n]
    labels, steps, skew = skew_matrix(hosts)
    reports = max((int(h.meta.get("reports", 0)) for h in hosts), default=0)
    notes = [window_message(window, reports)] if hosts else [
        f"no profile was written under {logdir}"]
    notes += [f"{h.label}: {h.meta['error']}" for h in hosts if h.meta.get("error")]
    trace_compiles = {h.label: sum(1 for e in _x_events(h.trace) if e.get("name") == COMPILE_EVENT)
                      for h in hosts}
    return ProfileReport(
        window=window, logdir=logdir, hosts=[h.label for h in hosts], breakdown=breakdown,
        skew_hosts=labels, skew_steps=steps, skew_s=skew, ops=ops, ops_source=source,
        compiles=compile_stats(hosts), trace_compiles=trace_compiles,
        message="; ".join(n for n in notes if n) or None,
        slots=[(str(h.meta.get("slice_name", "")), _int(h.meta.get("worker_id"))) for h in hosts])


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1
