"""One background refresher per session: reads the cluster every ``interval_s`` and feeds the views.

Views never call Ray. The refresher calls the session's single state reader (a function returning
a :class:`~raytpu_lab.state.model.ClusterSnapshot`) and hands each snapshot to every live view's
``update(snapshot)``; the views work out what changed and send only that. When reading fails (the
Ray connection dropped), views get ``set_status("disconnected ...")`` and the refresher keeps
trying; the first good read clears the status.

Pure of Ray and IPython: tests drive it with a plain function.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Protocol

from raytpu_lab.state.snapshot import ClusterSnapshot

__all__ = ["Refresher", "View", "DEFAULT_INTERVAL_S"]

DEFAULT_INTERVAL_S = 1.0


class View(Protocol):
    """What the refresher needs of a view (the topology map implements it)."""

    def update(self, snapshot: ClusterSnapshot) -> None: ...

    def set_status(self, text: str) -> None: ...


class Refresher:
    """Polls ``read`` every ``interval_s`` seconds on a daemon thread while it has views.

    Args:
        read: Returns a fresh snapshot; may raise when the cluster is unreachable.
        interval_s: Seconds between reads (> 0).

    Views are held weakly: a view that is garbage-collected, or that reports itself closed
    (``view.closed`` true), is dropped. The thread ends by itself when no views are left, so
    re-creating views never leaves more than one thread running.
    """

    def __init__(self, read: Callable[[], ClusterSnapshot], interval_s: float = DEFAULT_INTERVAL_S) -> None:
        self._read = read
        self._views: weakref.WeakSet[View] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._paused = False
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.interval_s = interval_s
        self.last_snapshot: ClusterSnapshot | None = None
        self.last_error: str | None = None

    @property
    def interval_s(self) -> float:
        """Seconds between reads."""
        return self._interval_s

    @interval_s.setter
    def interval_s(self, value: float) -> None:
        if value <= 0:
            raise ValueError(f"interval_s must be above 0, got {value}")
        self._interval_s = float(value)
        self._wake.set()

    @property
    def running(self) -> bool:
        """Whether the polling thread is alive."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def paused(self) -> bool:
        """Whether polling is paused (views keep their last state)."""
        return self._paused

    def add(self, view: View) -> None:
        """Feed ``view`` from now on (starts the thread if needed)."""
        with self._lock:
            self._views.add(view)
            self._stopped = False
            if self._thread is None:  # the loop clears it, under this lock, when it ends
                self._thread = threading.Thread(target=self._loop, name="raytpu-refresher", daemon=True)
                self._thread.start()
        self._wake.set()

    def discard(self, view: View) -> None:
        """Stop feeding ``view``."""
        with self._lock:
            self._views.discard(view)

    def pause(self) -> None:
        """Stop reading until :meth:`resume`."""
        self._paused = True

    def resume(self) -> None:
        """Read again, right away."""
        self._paused = False
        self._wake.set()

    def refresh_now(self) -> None:
        """Read once more without waiting for the interval."""
        self._wake.set()

    def stop(self, timeout_s: float = 5.0) -> None:
        """End the thread and forget every view."""
        with self._lock:
            self._stopped = True
            self._views = weakref.WeakSet()
        self._wake.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)

    def _loop(self) -> None:
        while True:
            with self._lock:
                views = [v for v in self._views if not getattr(v, "closed", False)]
                self._views = weakref.WeakSet(views)
                if self._stopped or not views:
                    self._thread = None
                    return
            if not self._paused:
                self._tick(views)
            self._wake.wait(self._interval_s)
            self._wake.clear()

    def _tick(self, views: list[View]) -> None:
        try:
            snapshot = self._read()
        except Exception as err:  # any failure to read means "disconnected" to the views
            if self.last_error is None:
                for view in views:
                    view.set_status(f"disconnected ({type(err).__name__}); retrying every "
                                    f"{self._interval_s:g} s")
            self.last_error = str(err)
            return
        if self.last_error is not None:
            for view in views:
                view.set_status("")
            self.last_error = None
        self.last_snapshot = snapshot
        for view in views:
            view.update(snapshot)
