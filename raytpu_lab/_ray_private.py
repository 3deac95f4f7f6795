"""Every use of Ray's private modules, in one place, so a Ray upgrade breaks only this file.

Checked against Ray 2.60.0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["available_resources_per_node", "ensure_auth_token", "enable_token_auth",
           "wrap_train_report"]


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


def wrap_train_report(hook: Callable[..., Any]) -> Callable[[], None]:
    """Route every ``ray.train.report`` of this Ray Train worker through ``hook(report, *args,
    **kwargs)``; returns a function that undoes it.

    Wraps the ``report`` of the worker's ``TrainFnUtils`` object
    (``ray.train.v2._internal.execution.train_fn_utils.get_train_fn_utils()``), which every
    public path reaches (``ray.train.report`` and a ``report`` imported from ``ray.train``);
    Ray's docstring of ``TrainFnUtils`` says it "can be patched if new user APIs behaviors is
    wanted". Call it inside the training function (the object exists only there).
    """
    from ray.train.v2._internal.execution.train_fn_utils import get_train_fn_utils

    utils = get_train_fn_utils()
    original = utils.report

    def report(*args: Any, **kwargs: Any) -> Any:
        return hook(original, *args, **kwargs)

    utils.report = report  # type: ignore[method-assign]  # instance attribute: this worker only

    def undo() -> None:
        if utils.__dict__.get("report") is report:
            del utils.report

    return undo
