"""The state reader every session service reads the cluster through (tests give a fake one).

It wraps :mod:`raytpu_lab.state.fetch` (the one place that reads Ray) and builds snapshots with
what the session knows beyond Ray (hosts expected, jobs on placement groups, KubeRay's plan).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from raytpu_lab._protocols import PlacementGroupLifetime, RawState
from raytpu_lab.advice import cmd
from raytpu_lab.errors import NotConnectedError
from raytpu_lab.reservations.info import ReservationInfo, list_reservations
from raytpu_lab.state import fetch
from raytpu_lab.state.model import ClusterSnapshot, PlannedSlice, build_snapshot

__all__ = ["SnapshotContext", "StateReader"]


@dataclass
class SnapshotContext:
    """What the session adds to Ray's view when it builds a snapshot.

    Attributes:
        expected_hosts: ``{slice name: hosts it should have}`` (emulator or RayCluster), or ``None``.
        jobs: ``{placement group id: label}`` of runs going on, e.g. ``"run mnist"``.
        planned: KubeRay's expected slices with their pods' state, or ``None``.
    """

    expected_hosts: dict[str, int] | None = None
    jobs: dict[str, str] = field(default_factory=dict)
    planned: list[PlannedSlice] | None = None


def _always() -> bool:
    return True


@dataclass
class StateReader:
    """Reads the cluster: raw state, placement-group lifetimes, live node count.

    Attributes:
        raw: Returns the raw state (:func:`~raytpu_lab.state.fetch.fetch_raw_state`'s shape).
        lifetimes: Returns ``{placement group id: {"is_detached", "creator_job_id"}}``.
        alive_nodes: Returns how many Ray nodes are alive.
        connected: Whether there is a cluster to read (the reads raise otherwise).
        context: Returns the :class:`SnapshotContext` for the next snapshot.
    """

    raw: Callable[[], RawState] = fetch.fetch_raw_state
    lifetimes: Callable[[], dict[str, PlacementGroupLifetime]] = fetch.fetch_placement_group_lifetimes
    alive_nodes: Callable[[], int] = fetch.count_alive_nodes
    connected: Callable[[], bool] = _always
    context: Callable[[], SnapshotContext] = SnapshotContext

    def require(self, doing: str) -> None:
        """Raise unless a cluster is connected (``doing``: what needs it, e.g. "reserve a slice").

        Raises:
            NotConnectedError: No cluster connected; the message says how to connect.
        """
        if not self.connected():
            raise NotConnectedError(
                f"Cannot {doing}: no Ray cluster is connected.",
                fix=("Start the local emulator (", cmd("up"), ") or connect (", cmd("connect", "ADDRESS"), ")."))

    def snapshot(self) -> ClusterSnapshot:
        """The cluster now: slices -> hosts -> chips with state and health.

        Raises:
            NotConnectedError: No cluster connected.
        """
        self.require("read the cluster state")
        ctx = self.context()
        return build_snapshot(self.raw(), expected_hosts=ctx.expected_hosts, jobs=dict(ctx.jobs),
                              planned=ctx.planned)

    def reservations(self) -> list[ReservationInfo]:
        """Every raytpu reservation on the cluster, sorted by name (see
        :func:`~raytpu_lab.reservations.info.list_reservations`).

        Raises:
            NotConnectedError: No cluster connected.
        """
        self.require("list the cluster's reservations")
        return list_reservations(self.raw(), self.lifetimes())
