"""Pure: what a bounded HTTP load against a served app measured, per second and in all.

One :class:`Sample` per request: when it was sent (seconds from the start of the load), its
latency (sent to last byte), whether it succeeded (HTTP 2xx), and for a streamed answer (more
than one chunk) the time to first chunk and the gaps between chunks. The definitions follow Ray
Serve LLM's benchmark summaries: time to first chunk (TTFT for a token stream) is sent to first
body bytes; inter-chunk latency is the mean gap between consecutive chunks of one response.
Percentiles are linear between closest ranks (numpy's default). No Ray, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Sample", "LoadStats", "percentile"]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of ``values``, linear between closest ranks; ``None``
    when empty."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class Sample:
    """One request.

    Attributes:
        sent_s: Seconds from the start of the load when it was sent.
        latency_s: Seconds from sending to the last byte (or to the error).
        ok: HTTP 2xx and the body read.
        status: HTTP status, or 0 when no answer came (connection error, timeout).
        chunks: Body chunks read.
        first_chunk_s: Seconds from sending to the first body bytes, or ``None``.
        inter_chunk_s: Mean seconds between consecutive chunks (``None`` with < 2 chunks).
        error: What went wrong, or ``""``.
    """

    sent_s: float
    latency_s: float
    ok: bool
    status: int = 200
    chunks: int = 1
    first_chunk_s: float | None = None
    inter_chunk_s: float | None = None
    error: str = ""


@dataclass
class LoadStats:
    """Samples of one load, and what they add up to.

    Attributes:
        rps: Requests per second asked for.
        duration_s: Seconds the load was to last.
        concurrency: Most requests in flight at once.
        samples: Every finished request, in finishing order.
    """

    rps: float
    duration_s: float
    concurrency: int
    samples: list[Sample] = field(default_factory=list)

    @property
    def streaming(self) -> bool:
        """Whether any answer came in several chunks."""
        return any(s.chunks > 1 for s in self.samples)

    def windows(self, bucket_s: float = 1.0) -> list[dict[str, Any]]:
        """Per ``bucket_s`` seconds of sending time: ``{"t": bucket start (s), "rps": requests
        sent per second that finished, "errors": count, "p50"/"p90"/"p99": latency (s) of the
        successful ones, "ttfc_p50", "itl_p50": (s) for streamed ones}`` in time order."""
        buckets: dict[int, list[Sample]] = {}
        for s in self.samples:
            buckets.setdefault(int(s.sent_s // bucket_s), []).append(s)
        return [self._row(i * bucket_s, group, bucket_s) for i, group in sorted(buckets.items())]

    def summary(self) -> dict[str, Any]:
        """The whole load: ``sent``, ``ok``, ``errors``, ``elapsed_s`` (first send to last
        answer), ``achieved_rps`` (successful / elapsed), latency ``p50``/``p90``/``p99`` (s),
        and for streamed answers ``ttfc_p50``/``ttfc_p99``/``itl_p50`` (s); the settings too."""
        ok = [s for s in self.samples if s.ok]
        elapsed = max((s.sent_s + s.latency_s for s in self.samples), default=0.0)
        lat = [s.latency_s for s in ok]
        first = [s.first_chunk_s for s in ok if s.first_chunk_s is not None and s.chunks > 1]
        gaps = [s.inter_chunk_s for s in ok if s.inter_chunk_s is not None]
        errors = [s.error or f"HTTP {s.status}" for s in self.samples if not s.ok]
        return {"rps_target": self.rps, "duration_s": self.duration_s,
                "concurrency": self.concurrency, "sent": len(self.samples), "ok": len(ok),
                "errors": len(errors), "first_error": errors[0] if errors else "",
                "elapsed_s": elapsed, "achieved_rps": len(ok) / elapsed if elapsed else 0.0,
                "p50": percentile(lat, 50), "p90": percentile(lat, 90), "p99": percentile(lat, 99),
                "streaming": self.streaming, "ttfc_p50": percentile(first, 50),
                "ttfc_p99": percentile(first, 99), "itl_p50": percentile(gaps, 50)}

    @staticmethod
    def _row(t: float, group: list[Sample], bucket_s: float) -> dict[str, Any]:
        lat = [s.latency_s for s in group if s.ok]
        first = [s.first_chunk_s for s in group if s.ok and s.first_chunk_s is not None
                 and s.chunks > 1]
        gaps = [s.inter_chunk_s for s in group if s.ok and s.inter_chunk_s is not None]
        return {"t": t, "rps": sum(1 for s in group if s.ok) / bucket_s,
                "errors": sum(1 for s in group if not s.ok),
                "p50": percentile(lat, 50), "p90": percentile(lat, 90), "p99": percentile(lat, 99),
                "ttfc_p50": percentile(first, 50), "itl_p50": percentile(gaps, 50)}
