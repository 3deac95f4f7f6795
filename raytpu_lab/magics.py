"""``%raytpu`` and ``%%raytpu``: a thin layer over :class:`raytpu_lab.lab.Lab`.

Each subcommand parses its arguments, calls one public method and displays the result. Errors
users can cause (:class:`~raytpu_lab.errors.RaytpuError`) fail the cell but show as one short block
(IPython's ``_render_traceback_`` hook, as ipyparallel's RemoteError does); ``--debug`` shows the
full traceback instead.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import html
import os
import shlex
import sys
import threading
import time
import traceback
from collections.abc import Callable, Coroutine
from typing import Any, NoReturn

from IPython import get_ipython
from IPython.core.async_helpers import _asyncio_runner
from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.display import display

from raytpu_lab._argtypes import positive_seconds
from raytpu_lab.cluster.emulator import DEFAULT_NAME
from raytpu_lab.errors import (
    InvalidTopologyError,
    RaytpuError,
    RemoteHostError,
    ReservationError,
    TrainingConfigError,
    TrainingError,
)
from raytpu_lab.lab import get_lab
from raytpu_lab.tpu.topology import SliceShape
from raytpu_lab.train.run import RunHandle
from raytpu_lab.widgets.profile_view import ProfileView
from raytpu_lab.widgets.run_dashboard import RunDashboard
from raytpu_lab.widgets.xla_view import XlaMetricsView

__all__ = ["RaytpuMagics", "WatchedRun", "build_parser"]


class _HelpShown(Exception):
    """``--help`` printed its text; nothing else to do."""


class DebugTraceback(Exception):
    """``--debug``: raised from a :class:`RaytpuError` so IPython prints the full traceback."""


class _Brief(Exception):
    """An unexpected error, shown as one block without a traceback (``--debug`` shows it)."""

    def _render_traceback_(self) -> list[str]:
        return str(self).splitlines()


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting the kernel, takes no abbreviated options (a typo
    such as ``--slice`` must not quietly mean ``--slices``), and names a mistyped option before
    complaining about the required one it hid."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._seen: list[str] = []

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        self._seen = list(args or [])
        return super().parse_known_args(args, namespace)

    def exit(self, status: int = 0, message: str | None = None) -> Any:  # type: ignore[override]
        if message:
            print(message, file=sys.stderr)
        raise _HelpShown

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        """As argparse, but leftover arguments are blamed on the subcommand that got them."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = getattr(parsed, "command", None)
            prog = f"{self.prog} {command}" if command else self.prog
            raise UsageError(f"{prog}: unrecognized arguments: {' '.join(extras)}\n"
                             f"(see {_help_hint(prog)})")
        return parsed

    def error(self, message: str) -> Any:  # type: ignore[override]
        unknown = [a for a in self._seen if a.startswith("-") and not a[1:2].isdigit()
                   and a.split("=")[0] not in self._option_string_actions]
        if unknown and message.startswith("the following arguments are required"):
            message = f"unrecognized arguments: {' '.join(unknown)} ({message})"
        raise UsageError(f"{self.prog}: {message}\n(see {_help_hint(self.prog)})")


#: Subcommands that are cell magics (``%%raytpu run ...``); their help is shown either way.
_CELL_COMMANDS = ("run", "jax", "torch")


def _help_hint(prog: str) -> str:
    """``%raytpu reserve --help``, or ``%%raytpu run --help`` for a cell subcommand."""
    words = prog.split()
    cell = len(words) > 1 and words[1] in _CELL_COMMANDS
    return f"{'%%' if cell else '%'}{prog} --help"


def build_parser() -> argparse.ArgumentParser:
    """The ``raytpu`` argument parser with one subparser per subcommand."""
    parser = _Parser(prog="raytpu", description="Ray on Cloud TPUs from a notebook.",
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show full tracebacks")
    # Set by _await_run_cells: the cell awaits the run, so the kernel keeps serving widgets.
    parser.add_argument("--await", dest="await_", action="store_true", help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    up = sub.add_parser("up", help="start a local emulated TPU cluster and connect to it")
    up.add_argument("--tpu", default="v6e:4x4", metavar="V:TOPO",
                    help="slice shape, e.g. v6e:4x4, v5e:2x2, v4:2x2x2, v7x:2x2x1 (default v6e:4x4)")
    up.add_argument("--slices", type=int, default=2, help="number of slices (default 2)")
    up.add_argument("--name", default=None,
                    help=f"cluster name (default {DEFAULT_NAME}, or the manifest's metadata.name)")
    up.add_argument("--manifest", metavar="FILE",
                    help="emulate this RayCluster manifest (its TPU worker groups) instead of --tpu")
    up.add_argument("--timeout", type=positive_seconds,
                    default=float(os.environ.get("RAYTPU_UP_TIMEOUT_S") or 180.0),
                    help="seconds to wait for every node to start (default 180, or "
                         "$RAYTPU_UP_TIMEOUT_S)")

    down = sub.add_parser("down", help="release reservations, disconnect, stop the emulated "
                                       "cluster this session started")
    down.add_argument("--name", default=None,
                      help="also stop the emulated cluster of this name, whoever started it")

    conn = sub.add_parser("connect", help="connect to a running Ray cluster (or a RayCluster on Kubernetes)")
    conn.add_argument("address", nargs="?",
                      help="GCS address HOST:PORT (6379 on KubeRay) or ray://HOST:10001 (default: "
                           "$RAY_ADDRESS, else the one emulated cluster running here); with "
                           "--kuberay, the Ray address to use instead of a port-forward")
    conn.add_argument("--timeout", type=float, default=15.0, help="seconds (default 15)")
    conn.add_argument("--kuberay", metavar="NAME", help="the RayCluster to connect to (kubernetes client)")
    _kube_options(conn)
    conn.add_argument("--no-port-forward", action="store_true",
                      help="outside the cluster, print the kubectl port-forward command instead")

    apply = sub.add_parser("apply", help="validate a RayCluster manifest and create/update it on Kubernetes")
    apply.add_argument("file", help="RayCluster manifest (YAML or JSON)")
    _kube_options(apply)

    scale = sub.add_parser("scale", help="set a TPU worker group's number of slices on Kubernetes")
    scale.add_argument("group", help="the worker group's groupName")
    scale.add_argument("--slices", type=int, required=True, help="slices wanted (replicas)")
    scale.add_argument("--cluster", help="RayCluster name (default: the connected one)")
    _kube_options(scale)

    delete = sub.add_parser("delete", help="delete a RayCluster on Kubernetes (asks to confirm)")
    delete.add_argument("cluster", nargs="?", help="RayCluster name (default: the connected one)")
    delete.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    _kube_options(delete)

    sub.add_parser("status", help="slices, hosts and chips: table and map")

    live = sub.add_parser("map", help="the live topology map (one per session, refreshed in the background)")
    live.add_argument("--interval", type=positive_seconds,
                      help="seconds between refreshes (default 1)")
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

    listing = sub.add_parser("reservations", help="list this session's reservations")
    listing.add_argument("--all", action="store_true",
                         help="every raytpu reservation on the cluster, from any kernel")

    run = sub.add_parser(
        "run", help="(cell magic) run the cell on every host of a reservation",
        description="Runs the cell on every host of reservation --on NAME, in one persistent\n"
                    "process per host (worker-id order) with jax.distributed initialised, so\n"
                    "variables persist from cell to cell on each host. Output is grouped per\n"
                    "host; the last expression of every host comes back as a list (rank order).",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("--on", required=True, metavar="NAME", help="reservation name")
    run.add_argument("--out", help="variable for the CellResult (outputs and values per host)")

    att = sub.add_parser("attach", help="adopt a detached reservation made by another kernel")
    att.add_argument("name")

    jax = sub.add_parser(
        "jax", help="(cell magic) run the cell's training function with JaxTrainer",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The cell defines the per-worker training function, f(config), which calls\n"
                    "ray.train.report({...}) every few steps (every rank equally often). The\n"
                    "function used is the only one defined, else train_loop_per_worker, else\n"
                    "--fn NAME. Ray Train's JaxTrainer runs it with one worker per TPU host on\n"
                    "--slices whole slices (ScalingConfig(use_tpu=True, topology, accelerator_type)).\n"
                    "A live dashboard shows every rank's metrics (any reported key), where each\n"
                    "rank runs, its logs, and a Stop button (Stop or a kernel interrupt aborts the\n"
                    "run and frees its slices). The result (records, placement, logs, summary) is\n"
                    "left in --out (default last_run); with --background the cell returns at once\n"
                    "and --out holds the run: last_run.wait(), last_run.stop(), last_run.result.")
    _run_options(jax, "4x4", "v6e", "jax.profiler")

    torch = sub.add_parser(
        "torch", help="(cell magic) run the cell's training function with TorchTrainer (PyTorch/XLA)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="The cell defines the per-worker training function, f(config), as for jax.\n"
                    "Ray Train's TorchTrainer runs it with one worker per TPU chip on --slices\n"
                    "whole slices (ScalingConfig(use_tpu=True, topology, accelerator_type,\n"
                    "resources_per_worker={'TPU': 1})). The function takes its XLA device and\n"
                    "averages gradients with raytpu_lab.train.torch_xla_utils (device(),\n"
                    "optimizer_step(opt, model)). Process group: torch_xla's xla on TPUs (or\n"
                    "--backend); on the emulator gloo with PJRT on CPU, whatever --backend says.\n"
                    "The same live dashboard as jax (metrics, placement: one rank per chip, logs,\n"
                    "Stop). Needs pip install 'raytpu_lab[torch]'.")
    torch.add_argument("--backend", choices=["xla", "tpu_dist", "gloo"],
                       help="process group on TPUs (default xla; the emulator runs gloo)")
    torch.add_argument("--chips-per-worker", type=int, default=1,
                       help="TPU chips per worker (default 1: one worker per chip)")
    _run_options(torch, "2x2x2", "v5p", "torch_xla's profiler")
    return parser


def _run_options(parser: argparse.ArgumentParser, topology: str, version: str,
                 profiler: str) -> None:
    """The options every training cell magic (jax, torch) shares (examples and profiler named
    for its trainer)."""
    parser.add_argument("--topology",
                        help=f"slice topology, e.g. {topology} (required without --reservation)")
    parser.add_argument("--version",
                        help=f"accelerator version, e.g. {version} (required without "
                             "--reservation)")
    parser.add_argument("--slices", type=int, default=1, help="slices (default 1)")
    parser.add_argument("--name", help="run name (default <function>-<HHMMSS>)")
    parser.add_argument("--fn", help="function to run if the cell defines several")
    parser.add_argument("--config",
                        help="Python expression for train_loop_config, e.g. \"{'steps': 100}\"")
    parser.add_argument("--out", default="last_run", help="variable for the result (default last_run)")
    parser.add_argument("--storage", help="Ray Train storage path")
    parser.add_argument("--background", action="store_true",
                        help="return at once; other cells run while the dashboard streams")
    parser.add_argument("--reservation", metavar="NAME",
                        help="run on exactly this reservation's slices, or fail (it gets them "
                             "back after)")
    parser.add_argument("--profile", metavar="START:STOP",
                        help=f"trace steps START..STOP-1 with {profiler} on every worker (a step "
                             "is one ray.train.report call); shown after the run")


def _kube_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--namespace", help="Kubernetes namespace (default: the context's)")
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")
    parser.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")


@magics_class
class RaytpuMagics(Magics):
    """``%raytpu COMMAND ...``, ``%%raytpu jax ...`` and ``%%raytpu torch ...``; ``%raytpu --help`` lists the commands."""

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell, **kwargs)
        cleanup = getattr(shell, "input_transformers_cleanup", None)
        if isinstance(cleanup, list):
            for transform in (_empty_cells_as_lines, _await_run_cells):
                if transform not in cleanup:
                    cleanup.append(transform)

    @line_cell_magic
    def raytpu(self, line: str, cell: str | None = None) -> Any:
        """Ray on Cloud TPUs: up, down, connect, status, reserve, release, reservations, attach,
        run, jax, torch, apply, scale, delete."""
        parser = build_parser()
        try:
            words = shlex.split(line)
        except ValueError as err:  # an unclosed quote
            raise UsageError(f"raytpu: cannot split the line into arguments: {err}.\n"
                             "Close every quote (' or \") you opened.") from None
        try:
            args = parser.parse_args(words)
        except _HelpShown:
            return None
        if not args.command:
            parser.print_help()
            return None
        handler: Callable[[argparse.Namespace, str | None], Any] = getattr(self, f"_do_{args.command}")
        try:
            result = handler(args, cell)
        except BaseException as err:
            _brief_errors(args, err)
            raise  # not reached: _brief_errors always raises
        if asyncio.iscoroutine(result):
            return _with_brief_errors(args, result)
        return result

    @property
    def _shell(self) -> Any:
        assert self.shell is not None, "magics run inside an IPython shell"
        return self.shell

    # -- subcommands -------------------------------------------------------------------------

    def _do_up(self, args: argparse.Namespace, cell: str | None) -> None:
        shown = display(_UpProgress(0, 0), display_id=True)

        def progress(up: int, expected: int) -> None:
            if shown is not None:
                shown.update(_UpProgress(up, expected))

        cluster = get_lab().up(args.tpu, args.slices, name=args.name, manifest=args.manifest,
                               timeout_s=args.timeout, progress=progress)
        joined = get_lab().started_cluster is not cluster
        print(f"Emulated cluster {cluster.name!r}: {_n(len(cluster.hosts), 'TPU host')} at {cluster.address} "
              f"(dashboard {cluster.dashboard_url})"
              + ("; it was already running with these slices, so this session joined it "
                 "(%raytpu down leaves it running)." if joined else ""))
        display(get_lab().status())

    def _do_down(self, args: argparse.Namespace, cell: str | None) -> None:
        lab = get_lab()
        mine = lab.started_cluster.name if lab.started_cluster is not None else None
        shared = lab.cluster if lab.cluster is not None and lab.cluster.name != mine else None
        stopped = lab.down(args.name)
        if stopped:
            print(f"Disconnected; emulated cluster {stopped!r} stopped.")
        elif shared is not None and shared.name != args.name:
            print(f"Disconnected; emulated cluster {shared.name!r} keeps running (this session did "
                  f"not start it). Stop it with %raytpu down --name {shared.name}.")
        else:
            print("Disconnected; no emulated cluster of this session was running.")

    def _do_connect(self, args: argparse.Namespace, cell: str | None) -> None:
        if args.kuberay:
            target = get_lab().connect_kuberay(
                args.kuberay, namespace=args.namespace, context=args.context,
                kubeconfig=args.kubeconfig, address=args.address,
                port_forward=not args.no_port_forward, timeout_s=args.timeout)
            slices = target.plan.expected_slices()
            via = " (port-forward)" if target.port_forward else ""
            print(f"Connected to RayCluster {target.name!r} in {target.namespace!r} at "
                  f"{target.address}{via}: expects {_n(len(slices), 'slice')}, "
                  f"{_n(sum(s.hosts for s in slices), 'TPU host')}.")
            display(get_lab().status())
            return
        address = get_lab().connect(args.address, timeout_s=args.timeout)
        cluster = get_lab().cluster
        print(f"Connected to {address}" + (f" (emulated cluster {cluster.name!r})." if cluster else "."))
        display(get_lab().status())

    def _do_apply(self, args: argparse.Namespace, cell: str | None) -> None:
        obj = get_lab().apply(args.file, namespace=args.namespace, context=args.context,
                              kubeconfig=args.kubeconfig)
        meta = obj.get("metadata") or {}
        print(f"Applied RayCluster {meta.get('name')!r} in namespace {meta.get('namespace')!r} "
              f"(generation {meta.get('generation', '?')}).")

    def _do_scale(self, args: argparse.Namespace, cell: str | None) -> None:
        notes = get_lab().scale(args.group, args.slices, name=args.cluster, namespace=args.namespace,
                                context=args.context, kubeconfig=args.kubeconfig)
        extra = f" ({'; '.join(notes)})" if notes else ""
        print(f"Worker group {args.group!r} set to {_n(args.slices, 'slice')}{extra}; KubeRay "
              "creates or deletes whole slices.")

    def _do_delete(self, args: argparse.Namespace, cell: str | None) -> None:
        lab = get_lab()
        name = args.cluster or (lab.kuberay.name if lab.kuberay else None)
        yes = args.yes
        if not yes and name:
            answer = input(f"Delete RayCluster {name!r} and all its pods (its TPU slices are freed)? "
                           "Type the name to confirm: ")
            yes = answer.strip() == name
            if not yes:
                print("Not deleted.")
                return
        deleted = lab.delete_raycluster(name, yes=yes, namespace=args.namespace, context=args.context,
                                        kubeconfig=args.kubeconfig)
        print(f"Deleted RayCluster {deleted!r}.")

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

    def _do_run(self, args: argparse.Namespace, cell: str | None) -> Any:
        if cell is None or not cell.strip():
            raise UsageError("%%raytpu run is a cell magic: put the code to run on every host in "
                             "the cell.\n(see %%raytpu run --help)")
        try:
            result = get_lab().run_on(args.on, cell)
        except SyntaxError as err:
            where = f"line {err.lineno}: " if err.lineno else ""
            text = (err.text or "").rstrip("\n")
            caret = f"\n    {text}\n    {' ' * max((err.offset or 1) - 1, 0)}^" if text else ""
            raise _Brief(f"SyntaxError in the cell, {where}{err.msg}{caret}\nNothing was sent to "
                         f"the hosts of {args.on!r}.") from None
        except RemoteHostError as err:
            if err.result is not None:
                print(err.result.text())
            raise
        text = result.text()
        if text:
            print(text)
        if args.out:
            self._shell.user_ns[args.out] = result
        values = result.values
        return None if all(v is None for v in values) else values

    def _do_attach(self, args: argparse.Namespace, cell: str | None) -> None:
        res = get_lab().attach(args.name)
        print(f"Attached {res.name!r}: {', '.join(res.slice_names)} "
              f"({_n(res.num_hosts, 'host')}, {_n(res.num_chips, 'chip')}, detached).")

    def _do_reservations(self, args: argparse.Namespace, cell: str | None) -> None:
        if args.all:
            self._print_cluster_reservations()
            return
        held = get_lab().reservations()
        if not held:
            print("No reservations in this session.")
        for r in held:
            print(f"{r.name}: {r.shape.pod_type} {r.shape.topology} on {', '.join(r.slice_names)} "
                  f"({_n(r.num_hosts, 'host')}, {_n(r.num_chips, 'chip')}"
                  f"{', detached' if r.detached else ''})")

    def _print_cluster_reservations(self) -> None:
        own = {r.name for r in get_lab().reservations()}
        infos = get_lab().cluster_reservations()
        if not infos:
            print("No raytpu reservations on the cluster.")
        for r in infos:
            life = {True: "detached", False: "default lifetime", None: "lifetime unknown"}[r.detached]
            whose = "this session" if r.name in own else f"job {r.creator_job_id or '?'}"
            print(f"{r.name}: {r.pod_type or '?'} {r.topology} on {', '.join(r.slice_names) or '-'} "
                  f"({_n(r.num_hosts, 'host')}, {_n(r.chips, 'chip')}; {life}; {whose}; {r.state})")

    def _do_jax(self, args: argparse.Namespace, cell: str | None) -> Any:
        if cell is None or not cell.strip():
            raise UsageError("%%raytpu jax is a cell magic: put the training function in the "
                             "cell.\n(see %%raytpu jax --help)")
        lab = get_lab()
        # Every refusal that needs no cluster comes first, cheapest first: nothing is shown,
        # contacted or started before the whole request is known to be runnable.
        self._shape_from_reservation(args)
        lab.check_jax(None, args.topology, args.version, slices=args.slices, profile=args.profile)
        config = self._config(args.config)
        lab.check_jax(None, args.topology, args.version, slices=args.slices, config=config)
        fn = self._training_function(cell, args.fn)
        lab.check_jax(fn, args.topology, args.version, slices=args.slices)
        name = args.name or _run_name(fn)  # one name for the dashboard, Ray Train and storage
        return self._watch_run(args, name, lambda **kw: lab.start_jax(
            fn, args.topology, args.version, slices=args.slices, name=name, config=config,
            storage_path=args.storage, mute_driver_logs=True, reservation=args.reservation,
            profile=args.profile, **kw))

    def _watch_run(self, args: argparse.Namespace, title: str,
                   start: Callable[..., RunHandle]) -> Any:
        """Start a run with a live dashboard; any trainer (``start(listener=, on_launch=)``).

        Blocking by default: as an awaited cell (see :func:`_await_run_cells`) the kernel keeps
        serving the Stop button, and an interrupt cancels the wait, which stops the run; without
        an event loop the wait blocks and Ctrl-C stops the run. ``--background`` returns a
        :class:`WatchedRun` at once.
        """
        if args.background:
            # Submitted, not launched: waiting for free slices and starting Ray Train's
            # controller happen in the run's own thread, so the cell returns now.
            get_lab().require_connection(f"launch run {title!r}")
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
        try:
            result = run.wait()
        except KeyboardInterrupt:
            self._shell.user_ns[args.out] = run.result  # what it did before the interrupt
            raise _Brief(f"raytpu {args.command}: interrupted; run {handle.name!r} was stopped "
                         "and its slices freed.") from None
        except TrainingError as err:
            raise self._failed(args, run, err) from None
        self._report(args, result)
        return None

    async def _finish_async(self, args: argparse.Namespace, run: WatchedRun) -> None:
        try:
            result = await run.wait_async()
        except asyncio.CancelledError:
            self._shell.user_ns[args.out] = run.result  # what it did before the interrupt
            raise _Brief(f"raytpu {args.command}: interrupted; run {run.handle.name!r} was "
                         "stopped and its slices freed.") from None
        except TrainingError as err:
            raise self._failed(args, run, err) from None
        self._report(args, result)

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
              f"{_n(s['steps'], counts[:-1])} in {s['wall_s']} s ({s['steps_per_s']} {counts}/s); "
              f"final {s['final_metrics']}. Result in `{args.out}`.")
        if s["trainer"] == "torch":
            display(XlaMetricsView.of(run))
        profile = get_lab().last_profile if getattr(args, "profile", None) else None
        if profile is not None:
            display(ProfileView(profile, snapshot=get_lab().snapshot()))

    def _shape_from_reservation(self, args: argparse.Namespace) -> None:
        """``--reservation NAME`` fills ``--topology/--version/--slices`` from the reservation."""
        if args.reservation:
            res = {r.name: r for r in get_lab().reservations()}.get(args.reservation)
            if res is None:
                held = ", ".join(r.name for r in get_lab().reservations()) or "none"
                raise ReservationError(
                    f"No reservation named {args.reservation!r} in this session.",
                    why=f"Reservations held: {held}.",
                    fix="Reserve it first (%raytpu reserve ...), or attach a detached one "
                        "(%raytpu attach NAME).")
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

    def _do_torch(self, args: argparse.Namespace, cell: str | None) -> Any:
        if cell is None or not cell.strip():
            raise UsageError("%%raytpu torch is a cell magic: put the training function in the "
                             "cell.\n(see %%raytpu torch --help)")
        lab = get_lab()
        self._shape_from_reservation(args)
        checks = {"slices": args.slices, "backend": args.backend,
                  "chips_per_worker": args.chips_per_worker}
        lab.check_torch(None, args.topology, args.version, profile=args.profile, **checks)
        config = self._config(args.config)
        lab.check_torch(None, args.topology, args.version, config=config, **checks)
        fn = self._training_function(cell, args.fn)
        lab.check_torch(fn, args.topology, args.version, **checks)
        name = args.name or _run_name(fn)
        return self._watch_run(args, name, lambda **kw: lab.start_torch(
            fn, args.topology, args.version, slices=args.slices, name=name, config=config,
            backend=args.backend, chips_per_worker=args.chips_per_worker,
            storage_path=args.storage, mute_driver_logs=True, reservation=args.reservation,
            profile=args.profile, **kw))

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
                raise _Brief(f"Run {self.dashboard.title!r} was stopped before it started.")

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
        try:
            while not self._launched.is_set():
                await asyncio.sleep(0.1)
        except asyncio.CancelledError:
            await asyncio.get_running_loop().run_in_executor(None, self.stop)
            raise
        handle = self.handle
        try:
            return await handle.wait_async()
        finally:
            if handle.done:
                self._freeze()

    def _show_launch_error(self, err: BaseException) -> None:
        """The launch failed: its one error block replaces the dashboard (nothing ran)."""
        if isinstance(err, RaytpuError):
            text = "\n".join(err._render_traceback_())
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


def _await_run_cells(lines: list[str]) -> list[str]:
    """IPython input transformer: a ``%%raytpu jax`` (or ``torch``) cell becomes ``await <the magic>``.

    An awaited cell leaves the kernel's event loop free while the run streams, and ipykernel
    (>= 7.4) dispatches widget (comm) messages during a running async cell, so the Stop button
    works; a kernel interrupt cancels the await, which stops the run. Only when IPython's
    autoawait runs on asyncio; otherwise the magic blocks (Ctrl-C still stops the run).
    """
    if not lines or not lines[0].startswith("%%raytpu"):
        return lines
    shell = _current_shell()
    if shell is None or not getattr(shell, "autoawait", False) \
            or shell.loop_runner is not _asyncio_runner:
        return lines
    line = lines[0][len("%%raytpu"):].strip()
    try:
        words = shlex.split(line)
    except ValueError:
        return lines
    command = next((w for w in words if not w.startswith("-")), None)
    if command not in ("jax", "torch") or "--background" in words or "-h" in words or "--help" in words:
        return lines
    body = "".join(lines[1:])
    return [f"await get_ipython().run_cell_magic('raytpu', {('--await ' + line)!r}, {body!r})\n"]


def _empty_cells_as_lines(lines: list[str]) -> list[str]:
    """IPython input transformer: a ``%%raytpu`` cell with an empty body runs as ``%raytpu``.

    IPython refuses a cell magic with an empty body before the magic sees it ("cell body is
    empty"), so ``%%raytpu run --help`` would never show its help; as a line magic the help
    shows, and a cell subcommand without its cell says what the cell should hold.
    """
    if not lines or not lines[0].startswith("%%raytpu") or "".join(lines[1:]).strip():
        return lines
    rest = lines[0][len("%%raytpu"):]
    if rest[:1] not in ("", " ", "\t", "\n"):
        return lines  # another magic whose name starts with raytpu
    return [f"get_ipython().run_line_magic('raytpu', {rest.strip()!r})\n"]


def _current_shell() -> Any:
    return get_ipython()


def _brief_errors(args: argparse.Namespace, err: BaseException) -> NoReturn:
    """Re-raise ``err`` as users should see it: one short block unless ``--debug``."""
    if isinstance(err, InvalidTopologyError):
        err = _in_command_syntax(err, args.command)
    if isinstance(err, RaytpuError):
        if args.debug:  # RaytpuError renders as a short block; chain it so IPython shows frames
            raise DebugTraceback(f"{type(err).__name__}: {err.what} (traceback above)") from err
        err.__cause__ = err.__context__ = None
        # shown by IPython through RaytpuError._render_traceback_: one short block
        raise err.with_traceback(None) from None
    if isinstance(err, KeyboardInterrupt | asyncio.CancelledError) and not args.debug:
        raise _Brief(f"raytpu {args.command}: interrupted.") from None
    if isinstance(err, UsageError | _Brief) or not isinstance(err, Exception) or args.debug:
        raise err
    raise _Brief(f"raytpu {args.command}: {type(err).__name__}: {err}\n"
                 "(run again with --debug for the traceback)") from None


_SHAPE_SYNTAX = {
    "up": "--tpu {version}:{topology}",
    "reserve": "reserve {topology} --version {version}",
    "jax": "--topology {topology} --version {version}",
    "torch": "--topology {topology} --version {version}",
}


def _in_command_syntax(err: InvalidTopologyError, command: str | None) -> InvalidTopologyError:
    """The error with its suggestions written as the failed command takes a shape, e.g.
    ``reserve 4x4 --version v6e`` rather than ``v6e:4x4``."""
    form = _SHAPE_SYNTAX.get(command or "")
    return err if form is None else err.in_syntax(form)


async def _with_brief_errors(args: argparse.Namespace, coro: Coroutine[Any, Any, Any]) -> Any:
    try:
        return await coro
    except BaseException as err:
        _brief_errors(args, err)


def _run_name(fn: Callable[..., Any]) -> str:
    """Default run name: the function's name and the time, e.g. ``train_loop_per_worker-165053``."""
    return f"{fn.__name__}-{time.strftime('%H%M%S')}"


def _is_shape(version: str, topology: str, shape: SliceShape) -> bool:
    """Whether ``version`` and ``topology`` name ``shape`` (aliases such as v5e included)."""
    try:
        return SliceShape.of(version, topology) == shape
    except RaytpuError:
        return False


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


class _UpProgress:
    """``Starting emulated hosts: 5 / 8 up``, as text and a small HTML line (updated in place)."""

    def __init__(self, up: int, expected: int) -> None:
        self.text = (f"Starting emulated TPU hosts: {up} / {expected} up" if expected
                     else "Starting the emulated head node ...")

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        return f"<code>{self.text}</code>"
