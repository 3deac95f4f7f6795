"""The smoke test's result: one row per TPU host (pure; no Ray).

:func:`raytpu_lab.reservations.check.check_reservation` fills a :class:`CheckReport`; this module
only holds and renders it: ``text/plain`` and a small ``text/html`` table (no script), so the
result reads the same in a notebook, an export and a shell.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["CheckReport", "HostCheck", "HostCheckStatus"]

HostCheckStatus = Literal["ok", "wrong", "error", "timeout", "not checked"]
"""``ok``: device counts and the collective's sum as expected; ``wrong``: it answered, with other
counts; ``error``: it raised (``detail`` has the traceback's last line); ``timeout``: no answer
within the check's timeout; ``not checked``: a slice skipped (degraded, or busy)."""


@dataclass
class HostCheck:
    """One host's smoke test.

    Attributes:
        slice_name: The host's slice.
        worker_id: Its worker id in the slice (``-1`` for a slice-wide ``not checked`` row).
        ip: Its IP address (``""`` if unknown).
        rank: Its JAX process index as assigned (worker-id order across the reservation's slices).
        status: See :data:`HostCheckStatus`.
        reservation: The reservation it was checked through (a temporary one when the check
            reserved the slice itself).
        expected_devices: Devices JAX should see in all (chips of the reservation).
        expected_local: Devices JAX should see on this host (chips per host).
        process_index: ``jax.process_index()`` (``None`` if it did not answer).
        process_count: ``jax.process_count()``.
        device_count: ``jax.device_count()`` (global).
        local_device_count: ``jax.local_device_count()``.
        psum: The collective's result: a ``psum`` of ones over every device (should equal
            ``expected_devices``).
        init_s: Seconds in ``jax.distributed.initialize`` (0 if the process had it already).
        first_s: Seconds for the collective's first call (compilation included), blocked on
            with ``block_until_ready``.
        collective_s: Seconds for a second call of the same collective, blocked on.
        detail: Why it is not ``ok``.
    """

    slice_name: str
    worker_id: int
    ip: str
    rank: int
    status: HostCheckStatus
    reservation: str = ""
    expected_devices: int = 0
    expected_local: int = 0
    process_index: int | None = None
    process_count: int | None = None
    device_count: int | None = None
    local_device_count: int | None = None
    psum: float | None = None
    init_s: float | None = None
    first_s: float | None = None
    collective_s: float | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        """The host answered with the expected counts and sum."""
        return self.status == "ok"

    @property
    def label(self) -> str:
        """``"tpu-v4-2x2x2-0 worker 1"`` (``"tpu-v4-2x2x2-0"`` for a slice-wide row)."""
        return self.slice_name if self.worker_id < 0 else f"{self.slice_name} worker {self.worker_id}"


_COLUMNS = ("host", "ip", "rank", "devices", "local", "psum", "collective", "status")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def _count(value: int | float | None, expected: int) -> str:
    if value is None:
        return "-"
    shown = f"{value:g}" if isinstance(value, float) else str(value)
    return shown if value == expected else f"{shown} (want {expected})"


def _row(h: HostCheck) -> tuple[str, ...]:
    status = h.status + (f": {h.detail}" if h.detail else "")
    return (h.label, h.ip or "-", "-" if h.worker_id < 0 else str(h.rank),
            _count(h.device_count, h.expected_devices), _count(h.local_device_count, h.expected_local),
            _count(h.psum, h.expected_devices), _seconds(h.collective_s), status)


@dataclass
class CheckReport:
    """Every host's smoke test, in reservation then rank order.

    Attributes:
        hosts: One :class:`HostCheck` per host (and one per slice not checked).
        timeout_s: The check's timeout (seconds): a host silent for that long is ``timeout``.
        wall_s: Seconds the whole check took.
    """

    hosts: list[HostCheck] = field(default_factory=list)
    timeout_s: float = 0.0
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        """Every checked host is ``ok`` (slices not checked do not count), and one was checked."""
        checked = [h for h in self.hosts if h.status != "not checked"]
        return bool(checked) and all(h.ok for h in checked)

    @property
    def failed(self) -> list[HostCheck]:
        """The hosts that erred, hung or answered with wrong counts."""
        return [h for h in self.hosts if h.status in ("wrong", "error", "timeout")]

    def summary(self) -> str:
        """One line: how many hosts passed, which failed, and the time taken."""
        checked = [h for h in self.hosts if h.status != "not checked"]
        line = (f"{sum(h.ok for h in checked)} of {len(checked)} hosts ok "
                f"({self.wall_s:.1f} s, timeout {self.timeout_s:.0f} s)")
        if self.failed:
            line += "; failed: " + ", ".join(f"{h.label} ({h.status})" for h in self.failed)
        return line

    def text(self) -> str:
        """The table as aligned text, then :meth:`summary`."""
        rows = [_COLUMNS, *(_row(h) for h in self.hosts)]
        widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS) - 1)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1]
                 for r in rows]
        return "\n".join([*lines, self.summary()])

    def html(self) -> str:
        """A small HTML table (no script, no style sheet), then :meth:`summary`."""
        head = "".join(f"<th style='text-align:left;padding:0 8px'>{c}</th>" for c in _COLUMNS)
        body = []
        for h in self.hosts:
            colour = {"ok": "#1a7f37", "not checked": "#6e7781"}.get(h.status, "#cf222e")
            cells = [f"<td style='padding:0 8px;white-space:nowrap'>{html.escape(c)}</td>" for c in _row(h)[:-1]]
            cells.append(f"<td style='padding:0 8px;color:{colour}'>{html.escape(_row(h)[-1])}</td>")
            body.append(f"<tr>{''.join(cells)}</tr>")
        return (f"<table class='raytpu-check'><thead><tr>{head}</tr></thead><tbody>{''.join(body)}"
                f"</tbody></table><p>{html.escape(self.summary())}</p>")

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": self.text(), "text/html": self.html()}

    def __repr__(self) -> str:
        return f"CheckReport({self.summary()})"
