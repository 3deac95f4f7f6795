"""Every use of Ray's private modules, in one place, so a Ray upgrade breaks only this file.

Checked against Ray 2.60.0.
"""

from __future__ import annotations

from typing import Any

__all__ = ["available_resources_per_node", "ensure_auth_token", "enable_token_auth"]


def available_resources_per_node() -> dict[str, dict[str, float]]:
    """``{node id (hex): {resource: available amount}}`` for live nodes.

    From ``ray._private.state.available_resources_per_node`` (a DeveloperAPI). Ray omits a resource
    whose available amount is zero, so a missing key means "none left", not "all free".
    """
    from ray._private import state

    result: dict[str, dict[str, Any]] = state.available_resources_per_node()
    return result


def ensure_auth_token() -> None:
    """Make sure Ray's default token file (``~/.ray/auth_token``) exists, as ``ray get-auth-token
    --generate`` would; Ray 2.60 uses it for clusters started with ``RAY_AUTH_MODE=token``.
    """
    from ray._private.authentication import authentication_token_setup as setup

    if not setup._get_default_token_path().exists():
        setup.generate_and_save_token()


def enable_token_auth() -> None:
    """Turn on Ray token auth for this process and its children (``RAY_AUTH_MODE=token``).

    Setting the variable alone is not enough once Ray's C++ config has been read in this process;
    Ray's own ``_enable_token_auth`` re-initialises it.
    """
    from ray._private.authentication import authentication_token_setup as setup

    setup._enable_token_auth()
