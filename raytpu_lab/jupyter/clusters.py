"""The clusters a Jupyter server knows: emulated ones on this machine, ``$RAY_ADDRESS``, and
KubeRay RayClusters named in the server's settings.

Ids are URL-safe: ``emulated-<name>``, ``address``, ``kuberay-<namespace>-<name>``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from raytpu_lab.cluster import emulator_state

__all__ = ["ClusterRef", "discover", "find", "UnknownClusterError"]

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


class UnknownClusterError(KeyError):
    """No cluster with that id is known to this server (the message lists the known ids)."""


@dataclass(frozen=True)
class ClusterRef:
    """One cluster the sidebar can show.

    Attributes:
        id: URL-safe id (see the module docstring).
        kind: ``"emulated"``, ``"address"`` or ``"kuberay"``.
        label: What the sidebar shows, e.g. ``"raytpu (emulated, 127.0.0.1:6379)"``.
        target: What the poller connects to: a Ray address, or ``"kuberay:<ns>/<name>"``.
        expected_hosts: ``{slice name: hosts}`` when known (the emulator's record).
        name: The emulated cluster's or RayCluster's name; ``""`` for an address.
    """

    id: str
    kind: str
    label: str
    target: str
    expected_hosts: dict[str, int] = field(default_factory=dict)
    name: str = ""

    def public(self) -> dict[str, Any]:
        """What the browser gets (no token: addresses carry none)."""
        out = asdict(self)
        out.pop("expected_hosts")
        return out


def discover(kuberay: Iterable[str] = (), ray_address: str | None = None) -> list[ClusterRef]:
    """Every cluster known now.

    Args:
        kuberay: RayClusters as ``"NAMESPACE/NAME"`` (or ``"NAME"`` for the current namespace).
        ray_address: ``$RAY_ADDRESS`` (read from the environment when ``None``; ``""``: none).
    """
    found: list[ClusterRef] = []
    for c in emulator_state.running():
        found.append(ClusterRef(id=f"emulated-{_SAFE.sub('_', c.name)}", kind="emulated",
                                label=f"{c.name} (emulated, {c.address})", target=c.address,
                                expected_hosts=c.expected_hosts, name=c.name))
    address = os.environ.get("RAY_ADDRESS", "") if ray_address is None else ray_address
    if address and address not in {c.target for c in found}:
        found.append(ClusterRef(id="address", kind="address", label=f"$RAY_ADDRESS ({address})",
                                target=address))
    for item in kuberay:
        ns, _, name = item.rpartition("/")
        found.append(ClusterRef(id=f"kuberay-{_SAFE.sub('_', ns or 'default')}-{_SAFE.sub('_', name)}",
                                kind="kuberay", label=f"RayCluster {item}",
                                target=f"kuberay:{item}", name=name))
    return found


def find(cluster_id: str, known: list[ClusterRef]) -> ClusterRef:
    """The cluster ``cluster_id`` of ``known``.

    Raises:
        UnknownClusterError: Not known (the message lists the known ids).
    """
    for c in known:
        if c.id == cluster_id:
            return c
    raise UnknownClusterError(f"no cluster {cluster_id!r} is known to this Jupyter server; "
                              f"known: {[c.id for c in known] or 'none'}")
