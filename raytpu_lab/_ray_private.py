"""Every use of Ray's private modules, in one place, so a Ray upgrade breaks only this file.

Checked against Ray 2.60.0.
"""

from __future__ import annotations

from typing import Any

__all__ = ["available_resources_per_node", "valid_tpu_topologies"]


def available_resources_per_node() -> dict[str, dict[str, float]]:
    """``{node id (hex): {resource: available amount}}`` for live nodes.

    From ``ray._private.state.available_resources_per_node`` (a DeveloperAPI). Ray omits a resource
    whose available amount is zero, so a missing key means "none left", not "all free".
    """
    from ray._private import state

    result: dict[str, dict[str, Any]] = state.available_resources_per_node()
    return result


def valid_tpu_topologies() -> dict[str, set[str]]:
    """Ray's own table of valid topologies per accelerator version (``VALID_TPU_TOPOLOGY``)."""
    from ray._private.accelerators import tpu

    return {k: set(v) for k, v in tpu.VALID_TPU_TOPOLOGY.items()}
