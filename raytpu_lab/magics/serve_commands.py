"""``%%raytpu serve --on NAME`` (the cell's deployment class on a reservation) and
``%raytpu serve status|delete APP``."""

from __future__ import annotations

import argparse
import json
from typing import Any

from IPython.core.error import UsageError

from raytpu_lab.errors import ServeError
from raytpu_lab.magics.context import CommandContext


class ServeCommands(CommandContext):
    """The serve subcommand (mixed into :class:`~raytpu_lab.magics.RaytpuMagics`)."""

    def _do_serve(self, args: argparse.Namespace, cell: str | None) -> Any:
        if args.action is not None:
            if not args.target:
                raise UsageError(f"%raytpu serve {args.action} APP: name the app.")
            if args.action == "status":
                return _status_text(self.session.serve_status(args.target))
            if args.action == "load":
                return self._load(args)
            self.session.serve_delete(args.target)
            print(f"Deleted app {args.target!r}; its slices' chips are back with the reservation.")
            return None
        if cell is None or not cell.strip() or not args.on:
            raise UsageError("%%raytpu serve --on NAME is a cell magic: the cell defines the "
                             "deployment class.\n(see %%raytpu serve --help)")
        ns = self._shell.user_ns
        before = {k: id(v) for k, v in ns.items()}
        result = self._shell.run_cell(cell, store_history=False)
        if result.error_in_exec is not None or result.error_before_exec is not None:
            return None  # IPython showed the error; nothing was deployed
        target = _defined_deployment(ns, before)
        kwargs = _init_kwargs(args.config, ns)
        served = self.session.serve(args.on, target, app=args.app, route=args.route,
                                    replicas=args.replicas, init_kwargs=kwargs,
                                    timeout_s=args.timeout)
        print(f"Serving {served.app!r} at {served.url} on {', '.join(served.plan.slice_names)} "
              f"(replicas on {', '.join(served.replica_hosts)}).")
        return None


    def _load(self, args: argparse.Namespace) -> None:
        from IPython.display import display

        from raytpu_lab.widgets.serve_panel import LoadPanel

        try:
            payload = json.loads(args.payload) if args.payload else None
        except ValueError as err:
            raise UsageError(f"--payload is not JSON: {err}.") from None
        app = args.target
        state = {"status": self.session.serve_status(app)}
        handle: list[Any] = []

        def tick(stats: Any) -> None:
            try:
                state["status"] = self.session.serve_status(app)
            except Exception:  # noqa: BLE001 (the panel keeps the last state it read)
                pass
            bundle = LoadPanel(app, stats, state["status"])._repr_mimebundle_()
            if handle:
                handle[0].update(bundle, raw=True)
            else:
                handle.append(display(bundle, raw=True, display_id=True))

        stats = self.session.serve_load(app, rps=args.rps, duration_s=args.duration,
                                        concurrency=args.concurrency, payload=payload, on_tick=tick)
        final = LoadPanel(app, stats, state["status"], done=True)._repr_mimebundle_()
        if handle:
            handle[0].update(final, raw=True)
        else:
            display(final, raw=True)
        self._shell.user_ns[args.out] = stats


def _defined_deployment(ns: dict[str, Any], before: dict[str, int]) -> Any:
    from ray.serve.deployment import Deployment

    new = [v for k, v in ns.items() if before.get(k) != id(v) and not k.startswith("_")
           and (isinstance(v, Deployment) or (isinstance(v, type) and v.__module__ == "__main__"))]
    if len(new) != 1:
        names = ", ".join(getattr(v, "__name__", getattr(v, "name", "?")) for v in new) or "none"
        raise ServeError(f"The cell must define exactly one deployment class; it defined: {names}.",
                         fix="Define one class (plain or @serve.deployment) in the serve cell.")
    return new[0]


def _status_text(status: dict[str, Any]) -> str:
    lines = [f"{status['app']}: {status['status']} at {status['url']} "
             f"(reservation {status['reservation']!r})"]
    for name, d in status["deployments"].items():
        lines.append(f"  {name}: {d['status']}, replicas {d['running']}/{d['target']} running")
    if status.get("replica_hosts"):
        lines.append(f"  replicas on {', '.join(status['replica_hosts'])}")
    if status.get("message"):
        lines.append(f"  {status['message']}")
    print("\n".join(lines))
    return ""


def _init_kwargs(text: str | None, ns: dict[str, Any]) -> dict[str, Any] | None:
    """``--config``: a Python expression (in the notebook's namespace) giving ``__init__``'s
    keyword arguments.

    Raises:
        ServeError: It does not evaluate, or not to a dict (nothing is deployed).
    """
    if not text:
        return None
    try:
        value = eval(text, ns)  # noqa: S307 (the user's own cell)
    except Exception as err:
        raise ServeError(f"--config {text!r} could not be evaluated: {type(err).__name__}: {err}.",
                         why="It is read as a Python expression in the notebook's namespace.",
                         fix="Pass a dict of __init__'s keyword arguments, e.g. "
                             "--config dict(w=w, b=b)") from None
    if not isinstance(value, dict):
        raise ServeError(f"--config {text!r} is a {type(value).__name__}, not a dict.",
                         why="Its items are the keyword arguments of the deployment's __init__.",
                         fix="Pass a dict, e.g. --config dict(w=w, b=b)")
    return value
