"""The ``%raytpu`` argument parser: one subparser per subcommand, options shared by the
subcommands that take them; ``up`` and ``down`` take the options the ``raytpu`` shell command
gives them too (:mod:`raytpu_lab.options`), so they mean the same thing in a cell and a shell."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from IPython.core.error import UsageError

from raytpu_lab._argtypes import positive_seconds
from raytpu_lab.options import add_down_options, add_up_options

__all__ = ["CELL_COMMANDS", "HelpShown", "build_parser", "join_expressions"]

#: Options whose value is a Python expression (``--config dict(w=w, b=b)``).
EXPRESSION_OPTIONS = ("--config",)


def join_expressions(words: list[str]) -> list[str]:
    """``words`` (a magic line split like a shell) with the words after an expression option
    (:data:`EXPRESSION_OPTIONS`, also as ``--config=...``) joined by spaces up to the next
    ``--option``: a Python expression has spaces (``--config dict(steps=100, lr=0.1)``), which
    a shell-like split cuts apart. Quotes are still the shell's: an expression holding strings
    is quoted whole (``--config "{'steps': 100}"``).

    >>> join_expressions(["serve", "--on", "s1", "--config", "dict(w=w,", "b=b)", "--app", "m"])
    ['serve', '--on', 's1', '--config', 'dict(w=w, b=b)', '--app', 'm']
    """
    out: list[str] = []
    i = 0
    while i < len(words):
        out.append(words[i])
        if words[i] in EXPRESSION_OPTIONS or words[i].startswith(
                tuple(f"{o}=" for o in EXPRESSION_OPTIONS)):
            j = i + 1
            while j < len(words) and not words[j].startswith("--"):
                j += 1
            if j > i + 1:
                if "=" in words[i]:  # --config=dict(a=1, b=2): the value started in this word
                    out[-1] = " ".join(words[i:j])
                else:
                    out.append(" ".join(words[i + 1:j]))
            i = j
        else:
            i += 1
    return out


class HelpShown(Exception):
    """``--help`` printed its text; nothing else to do."""



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
        raise HelpShown

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
CELL_COMMANDS = ("run", "jax", "torch")
#: ``%%raytpu serve --on NAME`` is a cell; ``%raytpu serve status|delete APP`` are lines.


def _help_hint(prog: str) -> str:
    """``%raytpu reserve --help``, or ``%%raytpu run --help`` for a cell subcommand."""
    words = prog.split()
    cell = len(words) > 1 and (words[1] in CELL_COMMANDS or words[1] == "serve")
    return f"{'%%' if cell else '%'}{prog} --help"


def build_parser() -> argparse.ArgumentParser:
    """The ``raytpu`` argument parser with one subparser per subcommand."""
    parser = _Parser(prog="raytpu", description="Ray on Cloud TPUs from a notebook.",
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show full tracebacks")
    # Set by await_run_cells: the cell awaits the run, so the kernel keeps serving widgets.
    parser.add_argument("--await", dest="await_", action="store_true", help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    up = sub.add_parser("up", help="start a local emulated TPU cluster and connect to it")
    add_up_options(up)

    down = sub.add_parser("down", help="release reservations, disconnect, stop the emulated "
                                       "cluster this session started")
    add_down_options(down)

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

    check = sub.add_parser("check", help="smoke-test hosts: JAX device counts and a blocked "
                                         "collective on every host")
    check.add_argument("name", nargs="?",
                       help="reservation to check (default: every idle intact slice, each "
                            "reserved for the check and released)")
    check.add_argument("--timeout", type=positive_seconds, default=60.0,
                       help="seconds a host may stay silent before it is named (default 60)")

    srv = sub.add_parser(
        "serve", help="(cell magic) serve the cell's deployment class on a reservation; "
                      "status|delete APP",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="%%raytpu serve --on NAME: the cell defines a Ray Serve deployment class (plain\n"
                    "or @serve.deployment); each replica holds one whole slice of reservation NAME\n"
                    "(one bundle per host, {'TPU': chips per host}, pinned by ray.io/tpu-slice-name)\n"
                    "while the reservation keeps the slice's head lock. In __init__, raytpu_lab.serve\n"
                    ".replica_hosts() runs code on every host of the slice. HTTP on 127.0.0.1.\n"
                    "%raytpu serve status APP / %raytpu serve delete APP (gives the chips back).\n"
                    "%raytpu serve load APP --rps R --duration S: a bounded load with a live panel.")
    srv.add_argument("action", nargs="?", choices=["status", "delete", "load"],
                     help="status, delete or load (a line, with APP)")
    srv.add_argument("target", nargs="?", metavar="APP", help="the app, with status/delete")
    srv.add_argument("--on", metavar="NAME", help="reservation to serve on (the cell)")
    srv.add_argument("--app", help="application name (default: the class name, lower case)")
    srv.add_argument("--route", help="HTTP route prefix (default /APP)")
    srv.add_argument("--replicas", type=int, default=1, help="replicas, one slice each (default 1)")
    srv.add_argument("--config", help="Python expression (spaces allowed, up to the next --option): "
                                     "keyword arguments for __init__, e.g. dict(w=w, b=b)")
    srv.add_argument("--timeout", type=positive_seconds, default=120.0,
                     help="seconds to wait for the replicas (default 120)")
    srv.add_argument("--rps", type=float, default=10.0, help="load: requests per second (default 10)")
    srv.add_argument("--duration", type=float, default=10.0, help="load: seconds (default 10)")
    srv.add_argument("--concurrency", type=int, default=8,
                     help="load: most requests in flight (default 8)")
    srv.add_argument("--payload", help="load: JSON body to POST (default: GET)")
    srv.add_argument("--out", default="last_load", help="load: variable for the stats (default last_load)")

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
    parser.add_argument("--max-failures", type=int, default=0, metavar="N",
                        help="restart the run up to N times when a worker group fails (a rank "
                             "raised, a host died): Ray Train's FailureConfig; -1: no limit "
                             "(default 0)")


def _kube_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--namespace", help="Kubernetes namespace (default: the context's)")
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")
    parser.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
