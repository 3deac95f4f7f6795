"""The run a ``%%raytpu jax --background`` cell leaves in ``--out``: handle plus dashboard."""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Callable
from typing import Any

from raytpu_lab.errors import RaytpuError
from raytpu_lab.magics.brief import Brief, in_cell
from raytpu_lab.train.run import RunHandle, wait_for_event
from raytpu_lab.widgets.run_dashboard import RunDashboard

__all__ = ["WatchedRun"]


class WatchedRun:
    """A run with its dashboard, as ``%%raytpu jax --background`` leaves it in ``--out``.

    Attributes:
        handle: The :class:`~raytpu_lab.train.run.RunHandle`.
        dashboard: The :class:`~raytpu_lab.widgets.run_dashboard.RunDashboard` shown in the cell.
    """

    def __init__(self, handle: RunHandle | None, dashboard: RunDashboard,
                 display_handle: Any) -> None:
        self.dashboard = dashboard
        self._display = display_handle
        self._frozen = False
        self._handle = handle
        self._launch_error: BaseException | None = None
        self._launched = threading.Event()
        self._stop_wanted = False
        self._lock = threading.Lock()
        if handle is not None:
            self._launched.set()

    @classmethod
    def launching(cls, launch: Callable[[Callable[[], None]], RunHandle], dashboard: RunDashboard,
                  display_handle: Any) -> WatchedRun:
        """A run launched in its own thread (``--background``): ``launch(on_launch)`` waits for
        free slices and starts it; ``on_launch`` raises if :meth:`stop` came first. A launch
        error replaces the dashboard with its one block and is raised by :meth:`wait`."""
        run = cls(None, dashboard, display_handle)
        threading.Thread(target=run._launch, args=(launch,), daemon=True,
                         name=f"raytpu-launch-{dashboard.title}").start()
        return run

    def _launch(self, launch: Callable[[Callable[[], None]], RunHandle]) -> None:
        def on_launch() -> None:
            if self._stop_wanted:
                raise Brief(f"Run {self.dashboard.title!r} was stopped before it started.")

        try:
            handle = launch(on_launch)
        except BaseException as err:  # noqa: BLE001 - shown in the cell's view, raised by wait()
            self._launch_error = err
            self._show_launch_error(err)
            self._launched.set()
            return
        with self._lock:
            self._handle = handle
            stop = self._stop_wanted
        self._launched.set()
        if stop:
            handle.stop()

    @property
    def handle(self) -> RunHandle:
        """The :class:`~raytpu_lab.train.run.RunHandle`; for a run still being launched
        (``--background``), waits for its launch.

        Raises:
            RaytpuError: The launch failed (e.g. no free slice within the wait).
        """
        self._launched.wait()
        if self._handle is None:
            assert self._launch_error is not None
            raise self._launch_error
        return self._handle

    @property
    def result(self) -> Any:
        """The :class:`~raytpu_lab.train.result.RunResult` (filling while the run goes on), or
        ``None`` while the run is still being launched or if its launch failed."""
        return self._handle.result if self._handle is not None else None

    @property
    def done(self) -> bool:
        """Whether the run has ended (or its launch failed)."""
        if not self._launched.is_set():
            return False
        return self._handle is None or self._handle.done

    def stop(self, timeout_s: float = 10.0) -> bool:
        """Abort the run and free its slices (see :meth:`RunHandle.stop`); a run still being
        launched does not start.

        Returns:
            Whether the run ended (or never started) within ``timeout_s`` seconds.
        """
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._stop_wanted = True
            handle = self._handle
        if handle is None:
            if not self._launched.wait(timeout_s):
                return False
            if self._handle is None:
                return True  # it never started
            handle = self._handle
        ok = handle.stop(max(0.0, deadline - time.monotonic()))
        if handle.done:
            self._freeze()
        return ok

    def wait(self, timeout_s: float | None = None) -> Any:
        """Block until the run ends and return its result; Ctrl-C stops it.

        Raises:
            TrainingError: The workers raised. KeyboardInterrupt: the run was stopped first.
            RaytpuError: The launch failed (``--background``; e.g. no free slice in time).
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            while not self._launched.wait(0.1):
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"run {self.dashboard.title!r} still launching after "
                                       f"{timeout_s} s")
        except KeyboardInterrupt:
            self.stop()
            raise
        handle = self.handle
        try:
            return handle.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        finally:
            if handle.done:
                self._freeze()

    async def wait_async(self) -> Any:
        """:meth:`wait` for an awaited cell; cancelling (a kernel interrupt) stops the run."""
        await wait_for_event(self._launched, on_cancel=self.stop)
        handle = self.handle
        try:
            return await handle.wait_async()
        finally:
            if handle.done:
                self._freeze()

    def _show_launch_error(self, err: BaseException) -> None:
        """The launch failed: its one error block replaces the dashboard (nothing ran)."""
        if isinstance(err, RaytpuError):
            text = "\n".join(in_cell(err)._render_traceback_())
        else:
            text = f"raytpu: the run could not start: {type(err).__name__}: {err}"
        self._frozen = True
        if self._display is None:
            return
        try:
            self._display.update({"text/plain": text, "text/html":
                                  f"<pre style='color:#b00020'>{html.escape(text)}</pre>"},
                                 raw=True)
        except Exception:  # the error is still raised by wait()
            pass

    def _freeze(self) -> None:
        """Swap the live dashboard for its static bundles (chart, tables) and close its widgets,
        so saved notebooks hold no widget view for it and the dashboard can be collected."""
        with self._lock:  # the run's end (drain thread) and wait() may both get here
            if self._frozen or self._display is None:
                return
            self._frozen = True
        try:
            self.dashboard.freeze()
        except Exception as err:  # the result matters more than its picture
            self.dashboard.show_error(f"static rendering failed: {type(err).__name__}: {err}")

    def __repr__(self) -> str:
        if self._handle is None:
            state = "failed to start" if self._launched.is_set() else "starting"
            return f"WatchedRun({self.dashboard.title!r}, {state})"
        return f"WatchedRun({self._handle!r})"
