"""Ray Serve deployments on reserved slices.

- :mod:`~raytpu_lab.serve.plan` (pure): where a deployment's replicas go on a reservation (one
  whole slice each: a bundle per host, pinned by slice label) and the checks before deploying;
- :mod:`~raytpu_lab.serve.service`: deploy, status, delete on Ray Serve, the reservation lending
  its chips while keeping its head locks;
- :mod:`~raytpu_lab.serve.replica`: inside a replica, :func:`replica_hosts` runs code on every
  host of its slice.

Importing this package imports no Ray (the pure part is re-exported; ``replica_hosts`` is
imported on first use).
"""

from __future__ import annotations

from typing import Any

from raytpu_lab.serve.plan import ServePlan, plan_deployment

__all__ = ["ServePlan", "plan_deployment", "replica_hosts"]


def __getattr__(name: str) -> Any:
    if name == "replica_hosts":
        from raytpu_lab.serve.replica import replica_hosts

        return replica_hosts
    raise AttributeError(name)
