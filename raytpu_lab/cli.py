"""``raytpu``: the emulator and the cluster view from a shell.

For the steps that do not belong in a notebook: start an emulated TPU cluster that outlives one
kernel (several notebooks or scripts can then ``%raytpu connect`` to it), list and stop clusters, and
print a cluster's slices as text. Everything else lives in the notebook (``%raytpu``) and the Python
API (:class:`raytpu_lab.lab.Lab`).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Literal

from raytpu_lab._argtypes import positive_seconds
from raytpu_lab.errors import InvalidTopologyError, RaytpuError
from raytpu_lab.options import DEFAULT_TPU, add_down_options, add_up_options

if TYPE_CHECKING:
    from raytpu_lab.lab import Lab

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raytpu", description=__doc__.splitlines()[0].replace("``", ""))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    up = sub.add_parser("up", help="start an emulated TPU cluster and leave it running")
    add_up_options(up)

    down = sub.add_parser("down", help="stop an emulated cluster (default raytpu)")
    add_down_options(down)

    sub.add_parser("list", help="list running emulated clusters")

    status = sub.add_parser("status", help="print a cluster's slices, hosts and chips")
    status.add_argument("address", nargs="?",
                        help="GCS address HOST:PORT (default: $RAY_ADDRESS, else the one "
                             "emulated cluster running here)")
    status.add_argument("--name", default=None, help="the emulated cluster of this name")

    check = sub.add_parser("check", help="smoke-test every idle intact slice: JAX device counts "
                                         "and a blocked psum on every host")
    check.add_argument("address", nargs="?",
                       help="GCS address HOST:PORT (default: $RAY_ADDRESS, else the one "
                            "emulated cluster running here)")
    check.add_argument("--name", default=None, help="the emulated cluster of this name")
    check.add_argument("--timeout", type=positive_seconds, default=60.0,
                       help="seconds a host may stay silent before it is named (default 60)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``raytpu`` command line; returns the process exit status (0 ok, 1 error).

    Errors users can cause print their what / why / what-to-do block on stderr, no traceback.
    """
    parser = _parser()
    args, extras = parser.parse_known_args(argv)
    if extras:  # blamed on the subcommand that got them, with its usage (exits 2)
        _subparser(parser, args.command).error(
            f"unrecognized arguments: {' '.join(extras)} (see raytpu {args.command} --help)")
    try:
        return _COMMANDS[args.command](args)
    except InvalidTopologyError as err:
        shaped = err.in_syntax("--tpu {version}:{topology}") if args.command == "up" else err
        print(shaped.spelled("shell"),
              file=sys.stderr)
        return 1
    except RaytpuError as err:
        print(err.spelled("shell"), file=sys.stderr)  # the one place the shell spells advice
        return 1


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]  # type: ignore[no-any-return]
    return parser


def _progress(up: int, expected: int) -> None:
    """Hosts up / expected on stderr: one line rewritten in a terminal, a line per host else."""
    line = f"starting emulated TPU hosts: {up} / {expected} up"
    if sys.stderr.isatty():
        print("\r" + line, end="", file=sys.stderr, flush=True)
    else:
        print(line, file=sys.stderr, flush=True)


def _up(args: argparse.Namespace) -> int:
    from raytpu_lab.cluster import emulator

    if args.manifest:
        from raytpu_lab.kuberay.emulate import up_from_manifest

        cluster = up_from_manifest(args.manifest, name=args.name, timeout_s=args.timeout,
                                   progress=_progress)
    else:
        specs = [(spec, args.slices) for spec in (args.tpu or [DEFAULT_TPU])]
        cluster = emulator.up(specs, name=args.name or emulator.DEFAULT_NAME,
                              timeout_s=args.timeout, progress=_progress)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    hosts = len(cluster.hosts)
    print(f"Emulated cluster {cluster.name!r}: {hosts} TPU host{'s' * (hosts != 1)} at {cluster.address}")
    print(f"  dashboard  {cluster.dashboard_url}")
    print(f"  notebook   %raytpu connect {cluster.address}")
    print(f"  stop       raytpu down --name {cluster.name}")
    return 0


def _down(args: argparse.Namespace) -> int:
    from raytpu_lab.cluster import emulator

    name = args.name or emulator.DEFAULT_NAME
    cluster = emulator.find(name)
    if cluster is None:
        others = ", ".join(c.name for c in emulator.running())
        print(f"No emulated cluster named {name!r} is running."
              + (f" Running: {others} (raytpu down --name NAME)." if others else ""))
        return 0
    cluster.down()
    print(f"Stopped emulated cluster {name!r}.")
    return 0


def _list(args: argparse.Namespace) -> int:
    from raytpu_lab.cluster import emulator

    clusters = emulator.running()
    if not clusters:
        print(f"No emulated clusters running (state under {emulator.state_root()}).")
    for c in clusters:
        shapes = ", ".join(f"{spec} x{count}" for spec, count in c.specs)
        hosts = len(c.hosts)
        print(f"{c.name}: {shapes}; {hosts} host{'s' * (hosts != 1)} at {c.address}")
    return 0


def _status(args: argparse.Namespace) -> int:
    from raytpu_lab.widgets.svg import render_status_text

    with _connected(args) as lab:
        if lab is None:
            return 1
        print(render_status_text(lab.snapshot()))
    return 0


@contextlib.contextmanager
def _connected(args: argparse.Namespace) -> Iterator[Lab | None]:
    """A session connected to the cluster ``args`` name (``None`` after saying that the named
    emulated cluster is not running); on leaving, what it reserved is released and the driver
    disconnected."""
    from raytpu_lab.cluster.connect import disconnect
    from raytpu_lab.lab import Lab

    address = _address(args)
    if address is False:
        yield None
        return
    lab = Lab()
    lab.connect(address)
    try:
        yield lab
    finally:
        lab.reservation_service.release_all()
        disconnect()


def _address(args: argparse.Namespace) -> str | None | Literal[False]:
    """The address to connect to (``None``: the default), or ``False`` after saying that the
    named emulated cluster is not running."""
    from raytpu_lab.cluster import emulator

    if args.address is None and args.name:
        found = emulator.find(args.name)
        if found is None:
            print(f"No emulated cluster {args.name!r} is running; pass HOST:PORT or another "
                  "--name (raytpu list shows the running ones).", file=sys.stderr)
            return False
        return found.address
    address: str | None = args.address
    return address


def _check(args: argparse.Namespace) -> int:
    with _connected(args) as lab:
        if lab is None:
            return 1
        report = lab.check(timeout_s=args.timeout)
    print(report.text())
    return 0 if report.ok else 1


_COMMANDS = {"up": _up, "down": _down, "list": _list, "status": _status, "check": _check}

if __name__ == "__main__":
    raise SystemExit(main())
