"""The run board: live runs published in Ray's key-value store, stoppable from another process.

A run lives in the thread of the kernel that started it; the Jupyter sidebar's poller (another
process, :mod:`raytpu_lab.jupyter.poll_worker`) must list it and stop it even while that kernel is
busy in a long cell. Each run's :class:`RunBoard` (a :class:`~raytpu_lab.train.run.RunListener`
the run service adds to every run) writes one JSON entry under ``run:<job id>:<run name>`` at most
once a second from the run's drain thread, and reads ``stop:<job id>:<run name>``: once that key
exists it calls :meth:`RunHandle.stop` in a thread of its own. No actor, no extra process: one GCS
call per second per run (Ray's internal KV, through :mod:`raytpu_lab._ray_private`).

Entry shape (:class:`RunEntry`): ``{"key", "name", "trainer", "state": "running" | "stopping" |
"finished" | "failed" | "stopped", "steps", "steps_per_s", "slices", "job_id", "updated_at"}``
(``updated_at``: seconds since the epoch; an entry not updated for :data:`STALE_S` while
``"running"`` belongs to a kernel that died: :func:`list_runs` reports it ``"lost"``).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, TypedDict

import ray

from raytpu_lab import _ray_private
from raytpu_lab.train.result import RunResult, RunUpdate

__all__ = ["RunBoard", "RunEntry", "list_runs", "request_stop", "STALE_S"]

_RUN = "run:"
_STOP = "stop:"
PUBLISH_EVERY_S = 1.0
STALE_S = 30.0
_KEEP_ENDED_S = 600.0


class RunEntry(TypedDict):
    """One run on the board (see the module docstring)."""

    key: str
    name: str
    trainer: str
    state: str
    steps: int
    steps_per_s: float
    slices: list[str]
    job_id: str
    updated_at: float


class RunBoard:
    """Publishes one run and obeys a stop request (a :class:`~raytpu_lab.train.run.RunListener`).

    Args:
        name: Run name.
        trainer: ``"jax"`` or ``"torch"``.

    Call :meth:`attach` with the run's handle once it exists; a stop request seen before that is
    obeyed at attach time. Without ``ray.init`` (unit tests with fake trainers) it does nothing.
    """

    def __init__(self, name: str, trainer: str) -> None:
        self.name = name
        self.trainer = trainer
        self._handle: Any = None
        self._stopping = False
        self._last = 0.0
        self._job_id = ""
        if ray.is_initialized():
            try:
                self._job_id = ray.get_runtime_context().get_job_id() or ""
            except Exception:  # a Ray Client driver: its job id is not exposed the same way
                self._job_id = ""
        self.key = f"{self._job_id}:{name}"

    def attach(self, handle: Any) -> None:
        """The run's :class:`~raytpu_lab.train.run.RunHandle` (whose ``stop()`` a request calls)."""
        self._handle = handle
        if self._stopping:
            self._stop_now()

    def on_update(self, update: RunUpdate) -> None:
        """Publish (at most once per :data:`PUBLISH_EVERY_S`) and check for a stop request."""
        if not ray.is_initialized():
            return
        now = time.time()
        if now - self._last < PUBLISH_EVERY_S:
            return
        self._last = now
        result = getattr(self._handle, "result", None)
        self._publish("stopping" if self._stopping else "running", result)
        if not self._stopping and _ray_private.kv_get(_STOP + self.key) is not None:
            self._stopping = True
            self._publish("stopping", result)
            self._stop_now()

    def on_end(self, result: RunResult) -> None:
        """Publish the final state; drop the stop request."""
        if not ray.is_initialized():
            return
        state = "stopped" if result.stopped else "failed" if result.error else "finished"
        self._publish(state, result)
        _ray_private.kv_del(_STOP + self.key)

    def _stop_now(self) -> None:
        handle = self._handle
        if handle is not None:
            threading.Thread(target=handle.stop, name=f"raytpu-board-stop-{self.name}",
                             daemon=True).start()

    def _publish(self, state: str, result: RunResult | None) -> None:
        entry = RunEntry(key=self.key, name=self.name, trainer=self.trainer, state=state,
                         steps=result.steps if result is not None else 0,
                         steps_per_s=round(result.steps_per_s, 3) if result is not None else 0.0,
                         slices=list(result.slice_names) if result is not None else [],
                         job_id=self._job_id, updated_at=time.time())
        _ray_private.kv_put(_RUN + self.key, json.dumps(entry).encode())


def list_runs(now: float | None = None) -> list[RunEntry]:
    """Every run on the board of the connected cluster, sorted by name; ended runs older than
    10 minutes are removed. Needs ``ray.init``.

    Returns:
        One :class:`RunEntry` each; a ``"running"`` entry silent for :data:`STALE_S` seconds is
        reported ``"lost"`` (its kernel died without ending it).
    """
    now = time.time() if now is None else now
    out: list[RunEntry] = []
    for key in _ray_private.kv_list(_RUN):
        raw = _ray_private.kv_get(key)
        if raw is None:
            continue
        try:
            entry: RunEntry = json.loads(raw)
        except ValueError:
            continue
        age = now - float(entry.get("updated_at", 0.0))
        if entry.get("state") in ("running", "stopping") and age > STALE_S:
            entry["state"] = "lost"
        if entry.get("state") not in ("running", "stopping") and age > _KEEP_ENDED_S:
            _ray_private.kv_del(key)
            continue
        out.append(entry)
    return sorted(out, key=lambda e: (e["name"], e["key"]))


def request_stop(key: str) -> bool:
    """Ask the run ``key`` (``"<job id>:<run name>"``, :attr:`RunEntry.key`) to stop; its kernel's
    board sees it within about a second and stops the run. Needs ``ray.init``.

    Returns:
        Whether such a run is on the board (running or not).
    """
    if _ray_private.kv_get(_RUN + key) is None:
        return False
    _ray_private.kv_put(_STOP + key, b"1")
    return True
