"""Interactive SPMD on a reservation: one persistent Python process per TPU host, cell after cell.

A :class:`SliceSession` starts one Ray actor per bundle of a reservation's placement group
(``PlacementGroupSchedulingStrategy(placement_group, placement_group_bundle_index=i)``, taking the
bundle's ``TPU`` chips, as ``ray.util.tpu.run_on_slice`` does), orders them by slice and worker id
(rank ``k`` runs on worker ``k``; rank 0 on the first slice's head), and calls
``jax.distributed.initialize`` once in every process with the coordinator on rank 0. Each host
keeps its own namespace, so variables persist from cell to cell, as ipyparallel's ``%px`` does.

On the emulator each host process is a Ray worker of an emulated TPU node, so it inherits the
node's environment (:func:`raytpu_lab.cluster.gke_env.emulated_jax_environment`): JAX on CPU with
one device per chip, collectives over gloo. On a real TPU pod the same code finds the chips.

Interrupts: Ray cannot interrupt a running actor task (``ray.cancel`` only flags it), so each host
process runs cells in one thread and :meth:`SliceSession.interrupt` raises ``KeyboardInterrupt``
in that thread (``PyThreadState_SetAsyncExc``). That stops Python code at its next bytecode; a
host blocked inside C code (a long ``time.sleep``, an XLA computation or a collective waiting for
a peer) does not notice. Hosts still running ``restart_after_s`` seconds after the interrupt are
restarted, all of them (``jax.distributed`` cannot re-admit one process): variables are lost and
the result says so.
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import io
import linecache
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from raytpu_lab import _ray_private
from raytpu_lab.advice import cmd
from raytpu_lab.errors import RemoteHostError, ReservationError
from raytpu_lab.reservations.info import HostSlot, host_order
from raytpu_lab.reservations.slices import Reservation
from raytpu_lab.state.fetch import fetch_raw_state

__all__ = ["SliceSession", "CellResult", "HostOutput", "check_cell", "collect"]

_CELL = "<cell>"  # file name of a cell's code in host tracebacks


@dataclass
class HostOutput:
    """What one host produced for one cell.

    Attributes:
        rank: JAX process index (0-based, worker-id order across slices).
        slice_name: The host's slice.
        worker_id: The host's worker id in its slice.
        ip: The host's IP address.
        stdout: Text the cell printed.
        stderr: Text the cell wrote to stderr.
        value: The cell's last expression (``None`` if it ended with a statement); its
            ``repr`` when it could not be sent back (e.g. a JAX array spanning hosts).
        error: The host's traceback text, or ``None``.
        duration_s: Seconds the cell ran on this host.
    """

    rank: int
    slice_name: str
    worker_id: int
    ip: str
    stdout: str = ""
    stderr: str = ""
    value: Any = None
    error: str | None = None
    duration_s: float = 0.0

    @property
    def label(self) -> str:
        """``"[rank 0 · tpu-v4-2x2x2-0 worker 0 · 10.0.0.2]"``."""
        return f"[rank {self.rank} · {self.slice_name} worker {self.worker_id} · {self.ip}]"


@dataclass
class CellResult:
    """One cell's outcome on every host, in rank order.

    Attributes:
        outputs: One :class:`HostOutput` per host.
        note: A remark about the session (e.g. that hosts were restarted), or ``""``.
    """

    outputs: list[HostOutput]
    note: str = ""

    @property
    def values(self) -> list[Any]:
        """The last expression of the cell on every host, in rank (worker-id) order."""
        return [o.value for o in self.outputs]

    def text(self) -> str:
        """Output grouped per host: a header line per host, then what it printed."""
        blocks = []
        for o in self.outputs:
            body = (o.stdout + (o.stderr and f"[stderr]\n{o.stderr}")).rstrip("\n")
            if body:
                blocks.append(f"{o.label}\n{body}")
        if self.note:
            blocks.append(self.note)
        return "\n".join(blocks)

    def __repr__(self) -> str:
        return f"CellResult(hosts={len(self.outputs)}, values={self.values!r})"


class _HostProcess:
    """Runs in one Ray worker per TPU host (a threaded actor: cells run in one thread, while
    ``interrupt`` arrives on another)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.namespace: dict[str, Any] = {"__name__": "__raytpu__"}
        self._cell_thread: int | None = None
        self._lock = threading.Lock()  # one cell at a time
        self._state = threading.Lock()  # guards _cell_thread against a racing interrupt

    def where(self) -> dict[str, Any]:
        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "ip": ray.util.get_node_ip_address(),
                "pid": os.getpid()}

    def coordinator_address(self) -> str:
        with socket.socket() as s:  # a free port; freed again for JAX's coordinator to bind
            s.bind(("", 0))
            port = s.getsockname()[1]
        return f"{ray.util.get_node_ip_address()}:{port}"

    def init_jax(self, coordinator: str, num_processes: int, timeout_s: int) -> dict[str, Any]:
        import jax

        jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=self.rank,
                                   initialization_timeout=timeout_s)
        self.namespace["jax"] = jax
        return {"process_index": jax.process_index(), "device_count": jax.device_count(),
                "local_device_count": jax.local_device_count()}

    def run(self, code: str | None, fn: Callable[..., Any] | None = None,
            args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            return self._run(code, fn, args, kwargs)
        except KeyboardInterrupt:  # an interrupt that landed just after the cell's own handler
            return {"value": None, "error": "KeyboardInterrupt (after the cell ended)",
                    "stdout": "", "stderr": "", "duration_s": 0.0}

    def _run(self, code: str | None, fn: Callable[..., Any] | None,
             args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> dict[str, Any]:
        out, err = io.StringIO(), io.StringIO()
        result: dict[str, Any] = {"value": None, "error": None}
        start = time.monotonic()
        with self._lock:
            with self._state:
                self._cell_thread = threading.get_ident()
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    if fn is not None:
                        result["value"] = fn(*args, **(kwargs or {}))
                    else:
                        result["value"] = self._exec(code or "")
            except BaseException as error:  # noqa: BLE001 - the user's error (KeyboardInterrupt too) goes back as text
                result["error"] = _user_traceback(error, code)
            finally:
                with self._state:
                    self._cell_thread = None
                    # Drop an interrupt raised too late to land in the cell: never in Ray's code.
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(threading.get_ident()), None)
        result["value"] = _sendable(result["value"])
        result.update(stdout=out.getvalue(), stderr=err.getvalue(),
                      duration_s=time.monotonic() - start)
        return result

    def _exec(self, code: str) -> Any:
        tree = ast.parse(code, filename=_CELL)
        last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        if last is not None:
            tree.body = tree.body[:-1]
        exec(compile(tree, _CELL, "exec"), self.namespace)  # noqa: S102 - the user's own cell
        if last is None:
            return None
        return eval(compile(ast.Expression(last.value), _CELL, "eval"), self.namespace)  # noqa: S307

    def push(self, values: dict[str, Any]) -> None:
        self.namespace.update(values)

    def interrupt(self) -> bool:
        with self._state:
            tid = self._cell_thread
            if tid is None:
                return False
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid),
                                                       ctypes.py_object(KeyboardInterrupt))
            return True


def _user_traceback(error: BaseException, code: str | None) -> str:
    """The traceback from the user's own code on: the cell's frames (with their source lines) or
    the called function's, without this module's frames above them."""
    tb = error.__traceback__
    if code is not None:
        linecache.cache[_CELL] = (len(code), None, code.splitlines(True), _CELL)
        cell_tb = tb
        while cell_tb is not None and cell_tb.tb_frame.f_code.co_filename != _CELL:
            cell_tb = cell_tb.tb_next
        tb = cell_tb or tb  # a SyntaxError from compile() has no cell frame: keep it whole
    elif tb is not None and tb.tb_next is not None:
        tb = tb.tb_next  # skip _run's own frame: the function's frames follow
    return "".join(traceback.format_exception(type(error), error, tb))


def _sendable(value: Any) -> Any:
    """The value if Ray can send it back, else its ``repr`` (e.g. a JAX array spanning hosts)."""
    try:
        ray.cloudpickle.dumps(value)
        return value
    except Exception:  # noqa: BLE001 - any pickling failure: fall back to text
        try:
            return repr(value)
        except Exception:  # noqa: BLE001
            return f"<{type(value).__name__} that cannot be sent back>"


def check_cell(code: str) -> None:
    """Parse a cell's code as the hosts will, here, before anything is sent to them.

    Raises:
        SyntaxError: It does not parse (``lineno``, ``offset`` and ``text`` say where).
    """
    ast.parse(code, filename=_CELL)


@dataclass
class SliceSession:
    """One persistent process per host of a reservation, with ``jax.distributed`` initialised.

    Create with :meth:`raytpu_lab.lab.Lab.slice_session` (or ``SliceSession(reservation).start()``);
    run cells with :meth:`run`, functions with :meth:`call`; :meth:`close` frees the processes (the
    reservation stays).

    Attributes:
        reservation: The reservation whose hosts it runs on.
        init_jax: Call ``jax.distributed.initialize`` when starting.
        timeout_s: Seconds to wait for the processes to start and JAX to initialise.
        restart_after_s: Seconds an interrupted cell may keep running before every host process
            is restarted.
        hosts: The hosts, in rank order (filled by :meth:`start`).
        jax_info: ``jax.process_index()/device_count()/local_device_count()`` per rank.
    """

    reservation: Reservation
    init_jax: bool = True
    timeout_s: float = 120.0
    restart_after_s: float = 5.0
    hosts: list[HostSlot] = field(default_factory=list)
    jax_info: list[dict[str, Any]] = field(default_factory=list)
    _actors: list[Any] = field(default_factory=list, repr=False)
    _mute: Any = field(default=None, repr=False)

    @property
    def started(self) -> bool:
        """The host processes are running."""
        return bool(self._actors)

    def start(self) -> SliceSession:
        """Start one process per host (worker-id order) and initialise ``jax.distributed``.

        Raises:
            ReservationError: The reservation's bundles are not all placed.
            RemoteHostError: A host failed to start or to initialise JAX (its traceback).
        """
        if self._actors:
            return self
        res = self.reservation
        try:
            self.hosts = host_order(fetch_raw_state(), res.placement_group.id.hex(), res.slice_names)
        except ValueError as err:
            raise ReservationError(f"Cannot run on reservation {res.name!r}: {err}.",
                                   why="Every host of the reservation must be up and placed.",
                                   fix=("Check ", cmd("status"), "; release and reserve again.")) from None
        chips = res.shape.chips_per_host
        cls = ray.remote(_HostProcess)
        self._actors = [
            cls.options(  # type: ignore[attr-defined]
                num_cpus=0, resources={"TPU": chips}, max_concurrency=2, max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=res.placement_group,
                    placement_group_bundle_index=slot.bundle_index),
            ).remote(rank)
            for rank, slot in enumerate(self.hosts)]
        try:
            where = self._get([a.where.remote() for a in self._actors], "start")
            for slot, seen in zip(self.hosts, where, strict=True):
                assert seen["node_id"] == slot.node_id, "a host process landed off its bundle's host"
            # Cells' output comes back grouped per host; Ray's driver copy of these processes'
            # logs (their prints again, gloo/JAX chatter) would flood whichever cell is running.
            pids = {str(seen["pid"]) for seen in where}
            self._mute = _ray_private.muted_worker_logs(lambda batch: str(batch.get("pid")) in pids)
            self._mute.__enter__()
            if self.init_jax:
                coordinator = self.coordinator()
                self.jax_info = self._get(
                    [a.init_jax.remote(coordinator, len(self._actors), int(self.timeout_s))
                     for a in self._actors], "initialise jax.distributed on")
        except BaseException:
            self.close()
            raise
        return self

    def run(self, code: str) -> CellResult:
        """Run ``code`` on every host (in its namespace); block until all finish.

        Returns:
            Output per host, in rank order; ``.values`` holds each host's last expression.

        Raises:
            SyntaxError: ``code`` does not parse (checked here; nothing is sent to the hosts).
            RemoteHostError: The cell raised on at least one host (shows the first host's
                traceback; ``.result`` has every host's output).
            KeyboardInterrupt: Interrupted (the cell was stopped on every host first).
        """
        check_cell(code)
        return self._dispatch(lambda a: a.run.remote(code))

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> CellResult:
        """Call ``fn(*args, **kwargs)`` on every host; as :meth:`run` for results and errors."""
        return self._dispatch(lambda a: a.run.remote(None, fn, args, kwargs))

    def submit_each(self, fn: Callable[..., Any], args_per_rank: list[tuple[Any, ...]]) -> list[Any]:
        """Start ``fn(*args_per_rank[rank])`` on every host without waiting; see :func:`collect`.

        Unlike :meth:`call`, a host that errs or hangs does not raise: the caller names it.

        Returns:
            One Ray object reference per rank.
        """
        self._require_started()
        return [a.run.remote(None, fn, args) for a, args in zip(self._actors, args_per_rank, strict=True)]

    def coordinator(self) -> str:
        """A ``HOST:PORT`` on rank 0's host with a free port, for ``jax.distributed.initialize``.

        Raises:
            RemoteHostError: Rank 0 did not answer within ``timeout_s``.
        """
        self._require_started()
        return str(self._get([self._actors[0].coordinator_address.remote()], "start")[0])

    def push(self, **values: Any) -> None:
        """Set variables in every host's namespace."""
        self._require_started()
        ray.get([a.push.remote(values) for a in self._actors])

    def interrupt(self) -> None:
        """Raise ``KeyboardInterrupt`` in the running cell on every host."""
        for a in self._actors:
            a.interrupt.remote()

    def close(self) -> None:
        """Stop the host processes (the reservation is kept). Idempotent."""
        actors, self._actors = self._actors, []
        for a in actors:
            with contextlib.suppress(Exception):  # already dead, or the cluster is gone
                ray.kill(a)
        self.jax_info = []
        mute, self._mute = self._mute, None
        if mute is not None:  # the dying processes' last words (JAX's coordination errors)
            unmute = threading.Timer(10.0, mute.__exit__, (None, None, None))  # arrive late
            unmute.daemon = True
            unmute.start()

    # -- helpers -------------------------------------------------------------------------

    def _require_started(self) -> None:
        if not self._actors:
            self.start()

    def _get(self, refs: list[Any], doing: str) -> list[Any]:
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self.timeout_s)
        if len(ready) < len(refs):
            done = {r.hex() for r in ready}
            silent = [f"{h.slice_name} worker {h.worker_id}" for h, r in
                      zip(self.hosts, refs, strict=False) if r.hex() not in done]
            raise RemoteHostError(
                f"Could not {doing} the hosts of {self.reservation.name!r} within "
                f"{self.timeout_s:.0f} s.",
                why=f"No answer from {', '.join(silent)}." if silent and len(refs) == len(self.hosts)
                else "A host process did not answer in time.",
                fix=("Check ", cmd("status"), "; release and reserve again."))
        try:
            return list(ray.get(refs))
        except ray.exceptions.RayError as err:
            raise RemoteHostError(f"Could not {doing} the hosts of {self.reservation.name!r}.",
                                  why=str(err), fix=("Check ", cmd("status"), ".")) from None

    def _dispatch(self, submit: Callable[[Any], Any]) -> CellResult:
        self._require_started()
        refs = [submit(a) for a in self._actors]
        try:
            pending = list(refs)
            while pending:
                _, pending = ray.wait(pending, num_returns=len(pending), timeout=0.2)
        except KeyboardInterrupt:
            self._stop(refs)
            raise
        try:
            raw = ray.get(refs)
        except ray.exceptions.RayActorError as err:
            self.close()
            raise RemoteHostError(
                f"A host process of {self.reservation.name!r} died during the cell.",
                why=str(err).splitlines()[0],
                fix="Run the cell again: the host processes are restarted (variables are lost).") from None
        result = CellResult([
            HostOutput(rank, s.slice_name, s.worker_id, s.ip, r["stdout"], r["stderr"], r["value"],
                       r["error"], r["duration_s"]) for rank, (s, r) in enumerate(zip(self.hosts, raw, strict=True))])
        failed = [o for o in result.outputs if o.error]
        if failed:
            first = failed[0]
            raise RemoteHostError(
                f"The cell failed on {len(failed)} of {len(result.outputs)} hosts; first {first.label}.",
                why=(first.error or "").rstrip(), fix="Fix the cell and run it again (variables set before "
                "the error are kept).", result=result, host=first)
        return result

    def _stop(self, refs: list[Any]) -> None:
        """Interrupt the running cell everywhere; restart the hosts that ignore it."""
        self.interrupt()
        _, still = ray.wait(refs, num_returns=len(refs), timeout=self.restart_after_s)
        if still:
            self.close()  # next cell starts fresh processes (jax.distributed needs all of them)


def collect(refs: list[Any], timeout_s: float) -> list[dict[str, Any] | None]:
    """Wait at most ``timeout_s`` seconds for :meth:`SliceSession.submit_each`'s references.

    Returns:
        Per rank, ``{"value", "error", "stdout", "stderr", "duration_s"}`` as the host sent it,
        ``{"value": None, "error": ...}`` if its process died, or ``None`` if it did not answer in
        time (its process is then still busy: :meth:`SliceSession.close` the session).
    """
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    done = {r.hex() for r in ready}
    out: list[dict[str, Any] | None] = []
    for ref in refs:
        if ref.hex() not in done:
            out.append(None)
            continue
        try:
            out.append(ray.get(ref))
        except ray.exceptions.RayError as err:
            out.append({"value": None, "error": str(err).splitlines()[0]})
    return out
