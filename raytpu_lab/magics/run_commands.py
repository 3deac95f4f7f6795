"""``%%raytpu jax`` and ``%%raytpu torch``: take the cell's training function, check the whole
request before anything starts, run it under a live dashboard, report its result."""

from __future__ import annotations

import argparse
import ast
import asyncio
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from IPython.core.error import UsageError
from IPython.display import display

from raytpu_lab.errors import RaytpuError, TrainingConfigError, TrainingError
from raytpu_lab.magics._text import count_of
from raytpu_lab.magics.brief import Brief
from raytpu_lab.magics.context import CommandContext
from raytpu_lab.magics.watched_run import WatchedRun
from raytpu_lab.tpu.topology import SliceShape
from raytpu_lab.train.run import RunHandle
from raytpu_lab.train.spec import RunSpec, TrainerKind, validate
from raytpu_lab.widgets.profile_view import ProfileView
from raytpu_lab.widgets.run_dashboard import RunDashboard
from raytpu_lab.widgets.xla_view import XlaMetricsView


class RunCommands(CommandContext):
    """The training cell subcommands (mixed into :class:`~raytpu_lab.magics.RaytpuMagics`)."""

    def _do_jax(self, args: argparse.Namespace, cell: str | None) -> Any:
        return self._do_training("jax", args, cell)

    def _do_torch(self, args: argparse.Namespace, cell: str | None) -> Any:
        return self._do_training("torch", args, cell)

    def _do_training(self, kind: TrainerKind, args: argparse.Namespace, cell: str | None) -> Any:
        """A training cell of any trainer: one RunSpec, checked in steps, started on the run path."""
        if cell is None or not cell.strip():
            raise UsageError(f"%%raytpu {kind} is a cell magic: put the training function in the "
                             f"cell.\n(see %%raytpu {kind} --help)")
        # Every refusal that needs no cluster comes first, cheapest first: nothing is shown,
        # contacted or started before the whole request is known to be runnable.
        self._shape_from_reservation(args)
        options = ({"backend": args.backend, "chips_per_worker": args.chips_per_worker}
                   if kind == "torch" else {})
        spec = RunSpec(kind, args.topology, args.version, slices=args.slices,
                       reservation=args.reservation, profile=args.profile,
                       storage_path=args.storage, max_failures=args.max_failures, **options)
        validate(spec)  # the shape, slices, max failures, profile window and backend options
        spec = replace(spec, config=self._config(args.config))
        validate(spec)
        fn = self._training_function(cell, args.fn)  # runs the cell
        name = args.name or _run_name(fn)  # one name for the dashboard, Ray Train and storage
        spec = replace(spec, train_fn=fn, name=name)
        validate(spec)
        return self._watch_run(args, name, lambda **kw: self.session.runs.start(
            spec, mute_driver_logs=True, **kw))

    def _watch_run(self, args: argparse.Namespace, title: str,
                   start: Callable[..., RunHandle]) -> Any:
        """Start a run with a live dashboard; any trainer (``start(listener=, on_launch=)``).

        Blocking by default: as an awaited cell (see :func:`await_run_cells`) the kernel keeps
        serving the Stop button, and an interrupt cancels the wait, which stops the run; without
        an event loop the wait blocks and Ctrl-C stops the run. ``--background`` returns a
        :class:`WatchedRun` at once.
        """
        if args.background:
            # Submitted, not launched: waiting for free slices and starting Ray Train's
            # controller happen in the run's own thread, so the cell returns now.
            self.session.require_connection(f"launch run {title!r}")
            dashboard = RunDashboard(title)
            run = WatchedRun.launching(
                lambda on_launch: start(listener=dashboard, on_launch=on_launch),
                dashboard, dashboard.show()[0])
            # Nobody may call wait(): the run freezes its view itself when it ends, as a
            # blocking cell does when its wait ends.
            dashboard.after_end = run._freeze
            dashboard.on_stop = run.stop
            self._shell.user_ns[args.out] = run
            print(f"Run {title!r} submitted in the background: `{args.out}.wait()`, "
                  f"`{args.out}.stop()`, `{args.out}.result`.")
            return None
        dashboard = RunDashboard(title)
        shown: list[Any] = []
        handle = start(listener=dashboard,
                       on_launch=lambda: shown.append(dashboard.show()))
        dashboard.on_stop = handle.stop
        run = WatchedRun(handle, dashboard, shown[0] if shown else None)
        if args.await_:
            return self._finish_async(args, run)
        with self._run_ending(args, run):
            result = run.wait()
        self._report(args, result)
        return None

    async def _finish_async(self, args: argparse.Namespace, run: WatchedRun) -> None:
        with self._run_ending(args, run):
            result = await run.wait_async()
        self._report(args, result)

    @contextmanager
    def _run_ending(self, args: argparse.Namespace, run: WatchedRun) -> Iterator[None]:
        """How a blocking or awaited cell's wait for its run ends when it does not return: an
        interrupt (Ctrl-C, or a cancelled await) stopped the run; a worker error fails the cell."""
        try:
            yield
        except (KeyboardInterrupt, asyncio.CancelledError):
            self._shell.user_ns[args.out] = run.result  # what it did before the interrupt
            raise Brief(f"raytpu {args.command}: interrupted; run {run.handle.name!r} was "
                        "stopped and its slices freed.") from None
        except TrainingError as err:
            raise self._failed(args, run, err) from None

    def _failed(self, args: argparse.Namespace, run: WatchedRun,
                err: TrainingError) -> TrainingError:
        """The cell's error for a failed run: one line when the dashboard above shows the
        failing rank's traceback already (one block per failure), else the whole text."""
        self._shell.user_ns[args.out] = run.result
        if not run.result.worker_errors or run.dashboard is None:
            return err
        first = (err.worker_error or err.why).splitlines()[0] if (err.worker_error or err.why) \
            else "a worker raised"
        return TrainingError(
            f"Training run {run.handle.name!r} failed: {first}",
            fix=f"The traceback is in the run's view above (also `{args.out}.error`); fix the "
                "training function and run the cell again. The slices were freed.",
            run_name=err.run_name, worker_error=err.worker_error)

    def _report(self, args: argparse.Namespace, run: Any) -> None:
        self._shell.user_ns[args.out] = run
        s = run.summary()
        state = "was stopped" if s["stopped"] else "finished"
        xla = ""
        if s["trainer"] == "torch":  # a PyTorch/XLA run (TorchRunResult)
            storm = (f"; recompilation storm on rank(s) {s['recompilation_storm']}"
                     if s["recompilation_storm"] else "")
            xla = (f" {s['workers']} workers, {s['backend']}, PJRT {s['pjrt_device']}, "
                   f"{s['xla_compiles']} XLA compiles{storm};")
        counts = s.get("counts", "steps")  # "reports" when the function reports no "step"
        print(f"Run {s['name']!r} {state} on {', '.join(s['slices']) or '?'}:{xla} "
              f"{count_of(s['steps'], counts[:-1])} in {s['wall_s']} s ({s['steps_per_s']} {counts}/s); "
              f"final {s['final_metrics']}. Result in `{args.out}`.")
        if s["trainer"] == "torch":
            display(XlaMetricsView.of(run))
        profile = self.session.last_profile if getattr(args, "profile", None) else None
        if profile is not None:
            display(ProfileView(profile, snapshot=self.session.snapshot()))

    def _shape_from_reservation(self, args: argparse.Namespace) -> None:
        """``--reservation NAME`` fills ``--topology/--version/--slices`` from the reservation."""
        if args.reservation:
            res = self.session.reservation_service.get(args.reservation)
            shape = res.shape
            clash = []
            if args.version and not _is_shape(args.version, shape.topology, shape):
                clash.append(f"--version {args.version} (the reservation's is {shape.version})")
            if args.topology and not _is_shape(shape.version, args.topology, shape):
                clash.append(f"--topology {args.topology} (the reservation's is {shape.topology})")
            if clash:
                raise UsageError(f"raytpu {args.command}: --reservation {res.name} runs on its "
                                 f"own slices; drop {', '.join(clash)}.")
            args.topology = args.topology or res.shape.topology
            args.version = args.version or res.shape.version
            if args.slices == 1:
                args.slices = len(res.slice_names)
        if not args.topology or not args.version:
            raise UsageError(f"raytpu {args.command}: --topology and --version are required (or "
                             "--reservation NAME of this session's reservations)")

    def _config(self, text: str | None) -> Any:
        """``--config``: a Python expression evaluated in the user namespace (the user's own code)."""
        if not text:
            return None
        try:
            return eval(text, self._shell.user_ns)  # noqa: S307
        except Exception as err:
            raise TrainingConfigError(
                f"--config {text!r} could not be evaluated: {type(err).__name__}: {err}.",
                why="It is read as a Python expression in the notebook's namespace.",
                fix="Pass a dict, e.g. --config \"{'steps': 100}\"") from None

    def _training_function(self, cell: str, wanted: str | None) -> Callable[..., Any]:
        """Run the cell in the user namespace and return the function it defines."""
        try:
            tree = ast.parse(cell)
        except SyntaxError as err:
            raise TrainingConfigError(f"The cell has a syntax error on line {err.lineno}: {err.msg}.",
                                      fix="Fix the cell and run it again.") from None
        defs = [n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
        self._define(cell)
        if wanted:
            name = wanted
        elif len(defs) == 1:
            name = defs[0]
        elif "train_loop_per_worker" in defs:
            name = "train_loop_per_worker"
        else:
            if not defs:
                raise UsageError("The cell defines no function; define the per-worker training "
                                 "function in it (def train_loop_per_worker(config): ...).")
            raise UsageError(
                f"The cell defines {len(defs)} functions ({', '.join(defs)}); define one "
                "per-worker training function, or pick one with --fn NAME.")
        fn = self._shell.user_ns.get(name)
        if not callable(fn):
            raise UsageError(f"--fn {name}: no function of that name in the cell.")
        return fn  # type: ignore[no-any-return]


    def _define(self, cell: str) -> None:
        """Run the cell's code in the user namespace (IPython syntax allowed), as a cell would.

        Raises:
            TrainingConfigError: The cell raised (its own traceback, not ours, is the why).
        """
        shell = self._shell
        code = shell.transform_cell(cell)
        try:
            filename = shell.compile.cache(code, shell.execution_count, raw_code=cell)
        except Exception:  # an IPython without the cell cache: tracebacks lose source lines
            filename = "<%%raytpu cell>"
        try:
            compiled = compile(code, filename, "exec")
        except SyntaxError as err:  # IPython syntax that transformed into bad Python
            raise TrainingConfigError(f"The cell has a syntax error on line {err.lineno}: "
                                      f"{err.msg}.", fix="Fix the cell and run it again.") from None
        try:
            exec(compiled, shell.user_ns)  # noqa: S102 - the user's own cell, as IPython runs it
        except Exception as err:
            frames = traceback.extract_tb(err.__traceback__)[1:]  # from the cell down
            line = next((f.lineno for f in frames if f.filename == filename), None)
            shown = "".join(traceback.format_list(frames[-6:])).rstrip()
            raise TrainingConfigError(
                f"The cell raised {type(err).__name__}: {err}"
                f"{f' (line {line})' if line else ''}, before any training function was taken.",
                why=f"Where, in the cell:\n{shown}" if shown else "",
                fix="Fix the cell and run it again; nothing was started.") from None



def _run_name(fn: Callable[..., Any]) -> str:
    """Default run name: the function's name and the time, e.g. ``train_loop_per_worker-165053``."""
    return f"{fn.__name__}-{time.strftime('%H%M%S')}"


def _is_shape(version: str, topology: str, shape: SliceShape) -> bool:
    """Whether ``version`` and ``topology`` name ``shape`` (aliases such as v5e included)."""
    try:
        return SliceShape.of(version, topology) == shape
    except RaytpuError:
        return False
