"""``%raytpu`` subcommands of the cluster: up, down, connect, status, map, and KubeRay's apply,
scale, delete. Each parses nothing itself (see :mod:`.parser`), calls the session, displays."""

from __future__ import annotations

import argparse
from typing import Any

from IPython.display import display

from raytpu_lab.magics._text import count_of
from raytpu_lab.magics.context import CommandContext
from raytpu_lab.options import DEFAULT_TPU


class ClusterCommands(CommandContext):
    """The cluster subcommands (mixed into :class:`~raytpu_lab.magics.RaytpuMagics`)."""

    def _do_up(self, args: argparse.Namespace, cell: str | None) -> None:
        shown = display(_UpProgress(0, 0), display_id=True)

        def progress(up: int, expected: int) -> None:
            if shown is not None:
                shown.update(_UpProgress(up, expected))

        cluster = self.session.up(args.tpu or [DEFAULT_TPU], args.slices, name=args.name,
                                  manifest=args.manifest, timeout_s=args.timeout,
                                  progress=progress)
        joined = self.session.started_cluster is not cluster
        print(f"Emulated cluster {cluster.name!r}: {count_of(len(cluster.hosts), 'TPU host')} at {cluster.address} "
              f"(dashboard {cluster.dashboard_url})"
              + ("; it was already running with these slices, so this session joined it "
                 "(%raytpu down leaves it running)." if joined else ""))
        display(self.session.status())

    def _do_down(self, args: argparse.Namespace, cell: str | None) -> None:
        lab = self.session
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
            target = self.session.connect_kuberay(
                args.kuberay, namespace=args.namespace, context=args.context,
                kubeconfig=args.kubeconfig, address=args.address,
                port_forward=not args.no_port_forward, timeout_s=args.timeout)
            slices = target.plan.expected_slices()
            via = " (port-forward)" if target.port_forward else ""
            print(f"Connected to RayCluster {target.name!r} in {target.namespace!r} at "
                  f"{target.address}{via}: expects {count_of(len(slices), 'slice')}, "
                  f"{count_of(sum(s.hosts for s in slices), 'TPU host')}.")
            display(self.session.status())
            return
        address = self.session.connect(args.address, timeout_s=args.timeout)
        cluster = self.session.cluster
        print(f"Connected to {address}" + (f" (emulated cluster {cluster.name!r})." if cluster else "."))
        display(self.session.status())

    def _do_apply(self, args: argparse.Namespace, cell: str | None) -> None:
        obj = self.session.apply(args.file, namespace=args.namespace, context=args.context,
                              kubeconfig=args.kubeconfig)
        meta = obj.get("metadata") or {}
        print(f"Applied RayCluster {meta.get('name')!r} in namespace {meta.get('namespace')!r} "
              f"(generation {meta.get('generation', '?')}).")

    def _do_scale(self, args: argparse.Namespace, cell: str | None) -> None:
        notes = self.session.scale(args.group, args.slices, name=args.cluster, namespace=args.namespace,
                                context=args.context, kubeconfig=args.kubeconfig)
        extra = f" ({'; '.join(notes)})" if notes else ""
        print(f"Worker group {args.group!r} set to {count_of(args.slices, 'slice')}{extra}; KubeRay "
              "creates or deletes whole slices.")

    def _do_delete(self, args: argparse.Namespace, cell: str | None) -> None:
        lab = self.session
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
        display(self.session.status())

    def _do_map(self, args: argparse.Namespace, cell: str | None) -> Any:
        lab = self.session
        if args.pause:
            lab.refresher.pause()
            print("Map refresh paused.")
            return None
        if args.resume:
            lab.refresher.resume()
            print("Map refresh resumed.")
            return None
        live = lab.map(interval_s=args.interval)
        # Displayed with an id, so `down` can replace it by its static copy (no dead widget saved).
        lab.feed.shown(display(live, display_id=True))
        return None



class _UpProgress:
    """``Starting emulated hosts: 5 / 8 up``, as text and a small HTML line (updated in place)."""

    def __init__(self, up: int, expected: int) -> None:
        self.text = (f"Starting emulated TPU hosts: {up} / {expected} up" if expected
                     else "Starting the emulated head node ...")

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        return f"<code>{self.text}</code>"
