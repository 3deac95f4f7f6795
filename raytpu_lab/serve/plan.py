"""Pure: how a Serve deployment is placed on a reservation's slices, and the checks before deploying.

A replica of a deployment served on a reservation takes one whole slice: its placement group
(Ray Serve's ``placement_group_bundles``) has one bundle per host of the slice,
``{"TPU": chips_per_host}``, every bundle pinned to that slice by the ``ray.io/tpu-slice-name``
label (``placement_group_bundle_label_selector``). The replica actor sits in bundle 0 and takes
that bundle's chips; code for the other hosts runs in actors on the other bundles
(:mod:`raytpu_lab.serve.replica`).

Checks, before anything is started (Ray Serve would otherwise wait forever for a placement that
cannot exist, and a multi-host TPU server whose tensor parallelism is not the slice's chip count
hangs, vllm-project/vllm#12179):

* more replicas than the reservation has slices;
* several replicas of a multi-host slice: Serve applies one label selector to every replica, so
  with several slices allowed a replica's bundles could straddle two slices;
* a replica asking for more chips than a slice has (``ray_actor_options`` TPU, or the
  deployment's own ``placement_group_bundles``);
* a ``tensor_parallel_size`` (in ``user_config`` or the ``__init__`` keyword arguments, at any
  depth) that is not the chip count of a slice.

No Ray, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from raytpu_lab.advice import Text, cmd, opt
from raytpu_lab.errors import ServeError
from raytpu_lab.tpu.labels import LABEL_SLICE

__all__ = ["ServePlan", "plan_deployment", "find_key", "check_app_name", "check_route"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class ServePlan:
    """Where and how a deployment's replicas run.

    Attributes:
        app: Serve application name.
        route: HTTP route prefix, e.g. ``"/echo"``.
        reservation: The reservation's name.
        slice_names: The slices the replicas may use (the first ``replicas`` of the reservation).
        hosts_per_replica: Hosts of one slice (bundles per replica).
        chips_per_host: Chips per host (TPU per bundle).
        replicas: Number of replicas.
    """

    app: str
    route: str
    reservation: str
    slice_names: list[str]
    hosts_per_replica: int
    chips_per_host: int
    replicas: int = 1
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def chips_per_replica(self) -> int:
        """Chips one replica holds (a whole slice)."""
        return self.hosts_per_replica * self.chips_per_host

    def bundles(self) -> list[dict[str, float]]:
        """Ray Serve's ``placement_group_bundles``: one ``{"TPU": chips_per_host}`` per host."""
        return [{"TPU": float(self.chips_per_host)} for _ in range(self.hosts_per_replica)]

    def label_selector(self) -> list[dict[str, str]]:
        """Ray Serve's ``placement_group_bundle_label_selector``: every bundle on the slice
        (``in(a,b)`` when several single-host slices serve several replicas)."""
        names = self.slice_names
        value = names[0] if len(names) == 1 else f"in({','.join(names)})"
        return [{LABEL_SLICE: value} for _ in range(self.hosts_per_replica)]

    def deployment_options(self) -> dict[str, Any]:
        """The options given to ``Deployment.options(...)`` (the user's, then the placement)."""
        actor = dict(self.options.get("ray_actor_options") or {})
        actor["num_cpus"] = actor.get("num_cpus", 0)
        resources = dict(actor.get("resources") or {})
        resources["TPU"] = float(self.chips_per_host)  # the replica holds bundle 0's chips
        actor["resources"] = resources
        return {"num_replicas": self.replicas, "ray_actor_options": actor,
                "placement_group_bundles": self.bundles(),
                "placement_group_bundle_label_selector": self.label_selector(),
                "placement_group_strategy": "STRICT_SPREAD" if self.hosts_per_replica > 1 else "PACK"}


def check_app_name(app: str) -> None:
    """Raise :class:`ServeError` unless ``app`` is one word usable as a Serve app name."""
    if not _NAME.match(app or "") or "#" in app:
        raise ServeError(f"{app!r} is not an application name.",
                         why="Serve app names are one word (letters, digits, '.', '-', '_').",
                         fix=("Pass another one: ", opt("app", "echo"), "."))


def check_route(route: str) -> None:
    """Raise :class:`ServeError` unless ``route`` is an HTTP path prefix (``/...``)."""
    if not route.startswith("/") or any(c.isspace() for c in route):
        raise ServeError(f"{route!r} is not a route prefix.",
                         why="Serve routes start with '/' and contain no spaces.",
                         fix="Pass e.g. /echo.")


def find_key(value: Any, key: str) -> Any:
    """The first value of ``key`` in nested mappings/sequences ``value`` (depth first), or ``None``."""
    if isinstance(value, Mapping):
        if key in value:
            return value[key]
        items: Sequence[Any] = list(value.values())
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        return None
    for item in items:
        found = find_key(item, key)
        if found is not None:
            return found
    return None


def plan_deployment(*, reservation: str, slice_names: Sequence[str], hosts_per_slice: int,
                    chips_per_host: int, pod_type: str, app: str, route: str, replicas: int = 1,
                    options: Mapping[str, Any] | None = None,
                    init_kwargs: Mapping[str, Any] | None = None) -> ServePlan:
    """Check a deployment against a reservation and say where its replicas go.

    Args:
        reservation: Reservation name (for messages).
        slice_names: The reservation's slices.
        hosts_per_slice: Hosts per slice.
        chips_per_host: TPU chips per host.
        pod_type: e.g. ``"v4-16"`` (for messages).
        app: Serve application name.
        route: HTTP route prefix.
        replicas: Replicas wanted (one slice each).
        options: The deployment's own options (``ray_actor_options``, ``user_config``,
            ``placement_group_bundles``), as ``@serve.deployment(...)`` set them.
        init_kwargs: Keyword arguments for the class's ``__init__``.

    Returns:
        The plan.

    Raises:
        ServeError: A check failed (the message gives the numbers: chips asked, chips per
            slice, slices held); nothing was started.
    """
    check_app_name(app)
    check_route(route)
    options = dict(options or {})
    slices = list(slice_names)
    chips_per_slice = hosts_per_slice * chips_per_host
    held = f"reservation {reservation!r} holds {len(slices)} {pod_type} slice(s) of " \
           f"{hosts_per_slice} host(s) x {chips_per_host} chips = {chips_per_slice} chips each"
    if replicas < 1:
        raise ServeError(f"replicas must be at least 1, not {replicas}.",
                         fix=("Pass ", opt("replicas", 1), "."))
    if replicas > len(slices):
        raise ServeError(f"{replicas} replicas need {replicas} slices (one whole slice each); "
                         f"{held}.", why="Each replica holds a whole slice.",
                         fix=("Ask for fewer replicas (", opt("replicas", len(slices)),
                              ") or reserve more slices (", cmd("reserve", "...", slices=replicas), ")."))
    if replicas > 1 and hosts_per_slice > 1:
        raise ServeError(f"{replicas} replicas of a multi-host slice ({hosts_per_slice} hosts) cannot "
                         "be kept one slice each.",
                         why="Ray Serve applies one bundle label selector to every replica; with "
                             "several slices allowed, one replica's bundles could straddle two "
                             "slices (Serve cannot gang-schedule replicas per slice yet, "
                             "ray-project/ray#60912).",
                         fix=("Serve one replica per reservation (", opt("replicas", 1), ")."))
    actor_chips = float(((options.get("ray_actor_options") or {}).get("resources") or {}).get("TPU", 0)
                        or (options.get("ray_actor_options") or {}).get("num_tpus", 0) or 0)
    if actor_chips > chips_per_host:
        raise (_too_many(f"its replica actor asks for {actor_chips:g} TPU chips on one host",
                                   f"a host has {chips_per_host}", held))
    user_bundles = options.get("placement_group_bundles") or []
    bundle_chips = sum(float(b.get("TPU", 0) or 0) for b in user_bundles)
    if bundle_chips > chips_per_slice or any(float(b.get("TPU", 0) or 0) > chips_per_host
                                             for b in user_bundles):
        raise (_too_many(f"its placement_group_bundles ask for {bundle_chips:g} TPU chips "
                                   f"({len(user_bundles)} bundle(s))",
                                   f"a slice has {chips_per_slice}, {chips_per_host} per host", held))
    for where, source in (("user_config", options.get("user_config")),
                          ("the __init__ arguments", dict(init_kwargs or {}))):
        tp = find_key(source, "tensor_parallel_size")
        if tp is not None and _as_int(tp) != chips_per_slice:
            raise ServeError(
                f"tensor_parallel_size={tp!r} (in {where}) is not the chip count of a slice: "
                f"{held}.",
                why="A model split over a different number of chips than the slice has leaves "
                    "chips idle or waits for chips that are not there (multi-host TPU serving "
                    "hangs then, vllm-project/vllm#12179).",
                fix=f"Set tensor_parallel_size={chips_per_slice}, or reserve a slice of "
                    f"{_as_int(tp)} chips.")
    kept = {k: v for k, v in options.items() if k not in ("placement_group_bundles",
                                                          "placement_group_bundle_label_selector",
                                                          "placement_group_strategy",
                                                          "num_replicas")}
    return ServePlan(app=app, route=route, reservation=reservation, slice_names=slices[:replicas],
                     hosts_per_replica=hosts_per_slice, chips_per_host=chips_per_host,
                     replicas=replicas, options=kept)


def _too_many(asked: str, has: str, held: str) -> ServeError:
    fix: Text = ("Ask for at most a slice's chips, or reserve a bigger slice (",
                 cmd("reserve", "..."), ").")
    return ServeError(f"The deployment asks for more chips than a slice has: {asked}; {has}.",
                      why=held[0].upper() + held[1:] + ".", fix=fix)


def _as_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
