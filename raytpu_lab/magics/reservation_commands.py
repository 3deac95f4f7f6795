"""``%raytpu`` subcommands of reservations: reserve, release, attach, reservations, and the
``%%raytpu run --on NAME`` cell on every host of one."""

from __future__ import annotations

import argparse
from typing import Any

from IPython.core.error import UsageError
from IPython.display import display

from raytpu_lab.errors import RemoteHostError
from raytpu_lab.magics._text import count_of
from raytpu_lab.magics.brief import Brief
from raytpu_lab.magics.context import CommandContext


class ReservationCommands(CommandContext):
    """The reservation subcommands (mixed into :class:`~raytpu_lab.magics.RaytpuMagics`)."""

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
            res = self.session.reserve(args.topology, args.version, slices=args.slices, name=args.name,
                                    timeout_s=args.timeout, detached=args.detached, on_wait=on_wait)
        finally:
            if progress:
                progress[0].update({"text/plain": ""}, raw=True)
        print(f"Reserved {res.name!r}: {', '.join(res.slice_names)} "
              f"({count_of(res.num_hosts, 'host')}, {count_of(res.num_chips, 'chip')}).")
        display(self.session.status(highlight=set(res.slice_names)))

    def _do_release(self, args: argparse.Namespace, cell: str | None) -> None:
        self.session.release(args.name)
        print(f"Released {args.name!r}.")

    def _do_run(self, args: argparse.Namespace, cell: str | None) -> Any:
        if cell is None or not cell.strip():
            raise UsageError("%%raytpu run is a cell magic: put the code to run on every host in "
                             "the cell.\n(see %%raytpu run --help)")
        try:
            result = self.session.run_on(args.on, cell)
        except SyntaxError as err:
            where = f"line {err.lineno}: " if err.lineno else ""
            text = (err.text or "").rstrip("\n")
            caret = f"\n    {text}\n    {' ' * max((err.offset or 1) - 1, 0)}^" if text else ""
            raise Brief(f"SyntaxError in the cell, {where}{err.msg}{caret}\nNothing was sent to "
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

    def _do_check(self, args: argparse.Namespace, cell: str | None) -> Any:
        return self.session.check(args.name, timeout_s=args.timeout)

    def _do_attach(self, args: argparse.Namespace, cell: str | None) -> None:
        res = self.session.attach(args.name)
        print(f"Attached {res.name!r}: {', '.join(res.slice_names)} "
              f"({count_of(res.num_hosts, 'host')}, {count_of(res.num_chips, 'chip')}, detached).")

    def _do_reservations(self, args: argparse.Namespace, cell: str | None) -> None:
        if args.all:
            self._print_cluster_reservations()
            return
        held = self.session.reservations()
        if not held:
            print("No reservations in this session.")
        for r in held:
            print(f"{r.name}: {r.shape.pod_type} {r.shape.topology} on {', '.join(r.slice_names)} "
                  f"({count_of(r.num_hosts, 'host')}, {count_of(r.num_chips, 'chip')}"
                  f"{', detached' if r.detached else ''})")

    def _print_cluster_reservations(self) -> None:
        own = {r.name for r in self.session.reservations()}
        infos = self.session.cluster_reservations()
        if not infos:
            print("No raytpu reservations on the cluster.")
        for r in infos:
            life = {True: "detached", False: "default lifetime", None: "lifetime unknown"}[r.detached]
            whose = "this session" if r.name in own else f"job {r.creator_job_id or '?'}"
            print(f"{r.name}: {r.pod_type or '?'} {r.topology} on {', '.join(r.slice_names) or '-'} "
                  f"({count_of(r.num_hosts, 'host')}, {count_of(r.chips, 'chip')}; {life}; {whose}; {r.state})")
