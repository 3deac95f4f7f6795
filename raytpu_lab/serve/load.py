"""A bounded HTTP load from the notebook against a served app (open loop, fixed rate).

Request ``i`` is due at ``i / rps`` seconds from the start, for ``duration_s`` seconds
(``ceil(rps * duration_s)`` requests in all); ``concurrency`` threads send them, each one
request at a time, so at most ``concurrency`` are in flight and a slow server makes requests
late rather than piling up. Each answer is read chunk by chunk (``http.client``'s ``read1``) to
time the first chunk and the gaps between chunks of a streamed answer. Stops at ``duration_s``
(plus at most ``timeout_s`` for the last answers); nothing is left running.
"""

from __future__ import annotations

import http.client
import json
import math
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from raytpu_lab._checks import require_positive
from raytpu_lab.serve.loadstats import LoadStats, Sample

__all__ = ["run_load"]


def run_load(url: str, *, rps: float, duration_s: float, concurrency: int = 8,
             payload: Any = None, timeout_s: float = 30.0,
             on_tick: Callable[[LoadStats], None] | None = None,
             tick_s: float = 1.0) -> LoadStats:
    """Send ``rps`` requests per second to ``url`` for ``duration_s`` seconds.

    Args:
        url: ``http://HOST:PORT/route``.
        rps: Requests per second (> 0).
        duration_s: Seconds of sending (> 0).
        concurrency: Threads sending, i.e. most requests in flight (> 0).
        payload: JSON-able body (POST ``application/json``); ``None`` sends GET.
        timeout_s: Seconds one request may take.
        on_tick: Called about every ``tick_s`` seconds (and at the end) with the stats so far,
            from the calling thread.

    Returns:
        The stats of every request sent.

    Raises:
        RaytpuError: ``rps``, ``duration_s`` or ``concurrency`` not positive (nothing sent).
    """
    require_positive("rps", rps)
    require_positive("duration", duration_s)
    require_positive("concurrency", concurrency)
    parts = urlsplit(url)
    body = None if payload is None else json.dumps(payload).encode()
    stats = LoadStats(rps=rps, duration_s=duration_s, concurrency=concurrency)
    total = math.ceil(rps * duration_s)
    lock = threading.Lock()
    counter = iter(range(total))
    start = time.monotonic()

    def worker() -> None:
        conn: http.client.HTTPConnection | None = None
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                break
            due = start + i / rps
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if conn is None:
                conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80,
                                                  timeout=timeout_s)
            sample, keep = _one(conn, parts.path or "/", body, start)
            if not keep:
                conn.close()
                conn = None
            with lock:
                stats.samples.append(sample)
        if conn is not None:
            conn.close()

    threads = [threading.Thread(target=worker, name=f"raytpu-load-{k}", daemon=True)
               for k in range(min(concurrency, total))]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        for t in threads:
            t.join(timeout=tick_s / max(len(threads), 1))
        if on_tick is not None:
            with lock:
                snapshot = LoadStats(rps, duration_s, concurrency, list(stats.samples))
            on_tick(snapshot)
    if on_tick is not None:
        on_tick(stats)
    return stats


def _one(conn: http.client.HTTPConnection, path: str, body: bytes | None,
         start: float) -> tuple[Sample, bool]:
    """One request: its sample, and whether the connection can be reused."""
    sent = time.monotonic()
    headers = {"Content-Type": "application/json"} if body is not None else {}
    try:
        conn.request("POST" if body is not None else "GET", path, body=body, headers=headers)
        resp = conn.getresponse()
        marks: list[float] = []
        while True:
            chunk = resp.read1(65536)
            if not chunk:
                break
            marks.append(time.monotonic())
        end = time.monotonic()
        gaps = [b - a for a, b in zip(marks, marks[1:], strict=False)]
        ok = 200 <= resp.status < 300
        return Sample(sent_s=sent - start, latency_s=end - sent, ok=ok, status=resp.status,
                      chunks=len(marks), first_chunk_s=(marks[0] - sent) if marks else None,
                      inter_chunk_s=(sum(gaps) / len(gaps)) if gaps else None,
                      error="" if ok else f"HTTP {resp.status}"), not resp.will_close
    except (OSError, http.client.HTTPException) as err:
        return Sample(sent_s=sent - start, latency_s=time.monotonic() - sent, ok=False, status=0,
                      chunks=0, error=f"{type(err).__name__}: {err}"), False
