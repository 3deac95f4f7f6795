"""``%raytpu`` and ``%%raytpu``: a thin layer over :class:`raytpu_lab.lab.Lab`.

Each subcommand parses its arguments, calls one public method and displays the result. Errors
users can cause (:class:`~raytpu_lab.errors.RaytpuError`) fail the cell but show as one short block
(IPython's ``_render_traceback_`` hook, as ipyparallel's RemoteError does); ``--debug`` shows the
full traceback instead.
"""

from __future__ import annotations

import argparse
import ast
import shlex
import sys
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.display import HTML, display

from raytpu_lab.cluster.emulator import DEFAULT_NAME
from raytpu_lab.errors import RaytpuError, TrainingConfigError
from raytpu_lab.lab import get_lab
from raytpu_lab.widgets.profile_view import ProfileView
from raytpu_lab.widgets.run_chart import RunChart

__all__ = ["RaytpuMagics", "build_parser"]


class _HelpShown(Exception):
    """``--help`` printed its text; nothing else to do."""


class _Brief(Exception):
    """An unexpected error, shown as one block without a traceback (``--debug`` shows it)."""

    def _render_traceback_(self) -> list[str]:
        return str(self).splitlines()


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting the kernel."""

    def exit(self, status: int = 0, message: str | None = None) -> Any:  # type: ignore[override]
        if message:
            print(message, file=sys.stderr)
        raise _HelpShown

    def error(self, message: str) -> Any:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}\n(see %{self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    """The ``raytpu`` argument parser with one subparser per subcommand."""
    parser = _Parser(prog="raytpu", description="Ray on Cloud TPUs from a notebook.",
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show full tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    up = sub.add_parser("up", help="start a local emulated TPU cluster and connect to it")
    up.add_argument("--tpu", default="v6e:4x4", metavar="V:TOPO",
                    help="slice shape, e.g. v6e:4x4, v5e:2x2, v4:2x2x2, v7x:2x2x1 (default v6e:4x4)")
    up.add_argument("--slices", type=int, default=2, help="number of slices (default 2)")
    up.add_argument("--name", default=DEFAULT_NAME, help="cluster name (default %(default)s)")

    sub.add_parser("down", help="release reservations, disconnect, stop the emulated cluster")

    conn = sub.add_parser("connect", help="connect to a running Ray cluster")
    conn.add_argument("address", help="GCS address HOST:PORT (6379 on KubeRay) or ray://HOST:10001")
    conn.add_argument("--timeout", type=float, default=15.0, help="seconds (default 15)")

    sub.add_parser("status", help="slices, hosts and chips: table and map")

    live = sub.add_parser("map", help="the live topology map (one per session, refreshed in the background)")
    live.add_argument("--interval", type=float, help="seconds between refreshes (default 1)")
    live.add_argument("--pause", action="store_true", help="stop refreshing (the map keeps its state)")
    live.add_argument("--resume", action="store_true", help="refresh again")

    res = sub.add_parser("reserve", help="reserve whole TPU slices atomically")
    res.add_argument("topology", help="e.g. 4x4, 2x2x2")
    res.add_argument("--version", required=True, help="accelerator version, e.g. v6e, v5e, v4")
    res.add_argument("--slices", type=int, default=1, help="slices to hold together (default 1)")
    res.add_argument("--name", help="reservation name (default r1, r2, ...)")
    res.add_argument("--timeout", type=float, default=60.0, help="seconds to wait (default 60)")
    res.add_argument("--detached", action="store_true", help="keep it when the kernel exits")

    rel = sub.add_parser("release", help="release a reservation")
    rel.add_argument("name")

    sub.add_parser("reservations", help="list this session's reservations")

    jax = sub.add_parser(
        "jax", help="(cell magic) run the cell's training function with JaxTrainer",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The cell defines the per-worker training function, f(config), which calls\n"
                    "ray.train.report({...}) every few steps (every rank equally often). The\n"
                    "function used is the only one defined, else train_loop_per_worker, else\n"
                    "--fn NAME. Ray Train's JaxTrainer runs it with one worker per TPU host on\n"
                    "--slices whole slices (ScalingConfig(use_tpu=True, topology, accelerator_type)).\n"
                    "A live loss / step-time chart shows rank 0's 'loss' and 'step_time_s'; the\n"
                    "result (records of every rank, summary) is left in --out (default last_run).")
    jax.add_argument("--topology", required=True, help="slice topology, e.g. 4x4")
    jax.add_argument("--version", required=True, help="accelerator version, e.g. v6e")
    jax.add_argument("--slices", type=int, default=1, help="slices (default 1)")
    jax.add_argument("--name", help="run name")
    jax.add_argument("--fn", help="function to run if the cell defines several")
    jax.add_argument("--config", help="Python expression for train_loop_config, e.g. \"{'steps': 100}\"")
    jax.add_argument("--out", default="last_run", help="variable for the result (default last_run)")
    jax.add_argument("--storage", help="Ray Train storage path")
    jax.add_argument("--profile", metavar="START:STOP",
                     help="trace steps START..STOP-1 with jax.profiler on every worker (a step is "
                          "one ray.train.report call); shown after the run")
    return parser


@magics_class
class RaytpuMagics(Magics):
    """``%raytpu COMMAND ...`` and ``%%raytpu jax ...``; ``%raytpu --help`` lists the commands."""

    @line_cell_magic
    def raytpu(self, line: str, cell: str | None = None) -> Any:
        """Ray on Cloud TPUs: up, down, connect, status, reserve, release, reservations, jax."""
        parser = build_parser()
        try:
            args = parser.parse_args(shlex.split(line))
        except _HelpShown:
            return None
        if not args.command:
            parser.print_help()
            return None
        handler: Callable[[argparse.Namespace, str | None], Any] = getattr(self, f"_do_{args.command}")
        try:
            return handler(args, cell)
        except RaytpuError as err:
            if not args.debug:
                err.__traceback__ = None
                err.__cause__ = err.__context__ = None
            raise  # shown by IPython through RaytpuError._render_traceback_: one short block
        except KeyboardInterrupt:
            if args.debug:
                raise
            raise _Brief(f"raytpu {args.command}: interrupted.") from None
        except (UsageError, _Brief):
            raise
        except Exception as err:
            if args.debug:
                raise
            raise _Brief(f"raytpu {args.command}: {type(err).__name__}: {err}\n"
                         "(run again with --debug for the traceback)") from None

    @property
    def _shell(self) -> Any:
        assert self.shell is not None, "magics run inside an IPython shell"
        return self.shell

    # -- subcommands -------------------------------------------------------------------------

    def _do_up(self, args: argparse.Namespace, cell: str | None) -> None:
        cluster = get_lab().up(args.tpu, args.slices, name=args.name)
        print(f"Emulated cluster {cluster.name!r}: {_n(len(cluster.hosts), 'TPU host')} at {cluster.address} "
              f"(dashboard {cluster.dashboard_url})")
        display(get_lab().status())

    def _do_down(self, args: argparse.Namespace, cell: str | None) -> None:
        stopped = get_lab().down()
        print(f"Disconnected; emulated cluster {stopped!r} stopped." if stopped
              else "No emulated cluster was running; disconnected.")

    def _do_connect(self, args: argparse.Namespace, cell: str | None) -> None:
        get_lab().connect(args.address, timeout_s=args.timeout)
        print(f"Connected to {args.address}.")
        display(get_lab().status())

    def _do_status(self, args: argparse.Namespace, cell: str | None) -> None:
        display(get_lab().status())

    def _do_map(self, args: argparse.Namespace, cell: str | None) -> Any:
        lab = get_lab()
        if args.pause:
            lab.refresher.pause()
            print("Map refresh paused.")
            return None
        if args.resume:
            lab.refresher.resume()
            print("Map refresh resumed.")
            return None
        return lab.map(interval_s=args.interval)

    def _do_reserve(self, args: argparse.Namespace, cell: str | None) -> None:
        progress: list[Any] = []  # a display appears only once we actually wait

        def on_wait(elapsed_s: float) -> None:
            text = {"text/plain": f"waiting for {args.slices} free {args.version} {args.topology} "
                                  f"slice(s)... {elapsed_s:.0f} s of {args.timeout:.0f} s"}
            if progress:
                progress[0].update(text, raw=True)
            else:
                progress.append(display(text, raw=True, display_id=True))

        try:
            res = get_lab().reserve(args.topology, args.version, slices=args.slices, name=args.name,
                                    timeout_s=args.timeout, detached=args.detached, on_wait=on_wait)
        finally:
            if progress:
                progress[0].update({"text/plain": ""}, raw=True)
        print(f"Reserved {res.name!r}: {', '.join(res.slice_names)} "
              f"({_n(res.num_hosts, 'host')}, {_n(res.num_chips, 'chip')}).")
        display(get_lab().status(highlight=set(res.slice_names)))

    def _do_release(self, args: argparse.Namespace, cell: str | None) -> None:
        get_lab().release(args.name)
        print(f"Released {args.name!r}.")

    def _do_reservations(self, args: argparse.Namespace, cell: str | None) -> None:
        held = get_lab().reservations()
        if not held:
            print("No reservations in this session.")
        for r in held:
            print(f"{r.name}: {r.shape.pod_type} {r.shape.topology} on {', '.join(r.slice_names)} "
                  f"({_n(r.num_hosts, 'host')}, {_n(r.num_chips, 'chip')}"
                  f"{', detached' if r.detached else ''})")

    def _do_jax(self, args: argparse.Namespace, cell: str | None) -> Any:
        if cell is None:
            raise UsageError("%%raytpu jax is a cell magic: put the training function in the cell.")
        fn = self._training_function(cell, args.fn)
        config = self._config(args.config)
        chart = RunChart(args.name or fn.__name__)
        handles: list[Any] = []
        try:
            run = get_lab().train_jax(
                fn, args.topology, args.version, slices=args.slices, name=args.name, config=config,
                storage_path=args.storage, on_records=chart.add, profile=args.profile,
                on_launch=lambda: handles.append(display(chart.figure, display_id=True)))
        finally:
            # Swap the live widget for a static chart, so exports and reloads still show it.
            if handles and handles[0] is not None and chart.has_data:
                handles[0].update(HTML(chart.static_html()))
        self._shell.user_ns[args.out] = run
        s = run.summary()
        print(f"Run {s['name']!r} finished on {', '.join(s['slices']) or '?'}: {s['steps']} steps in "
              f"{s['wall_s']} s ({s['steps_per_s']} steps/s); final {s['final_metrics']}. "
              f"Result in `{args.out}`.")
        profile = get_lab().last_profile if args.profile else None
        if profile is not None:
            display(ProfileView(profile, snapshot=get_lab().snapshot()))
        return None

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
        result = self._shell.run_cell(cell, store_history=False, silent=True)
        result.raise_error()
        if wanted:
            name = wanted
        elif len(defs) == 1:
            name = defs[0]
        elif "train_loop_per_worker" in defs:
            name = "train_loop_per_worker"
        else:
            raise UsageError(
                f"The cell defines {len(defs)} functions ({', '.join(defs) or 'none'}); "
                "define one per-worker training function, or pick one with --fn NAME.")
        fn = self._shell.user_ns.get(name)
        if not callable(fn):
            raise UsageError(f"--fn {name}: no function of that name in the cell.")
        return fn  # type: ignore[no-any-return]


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"
