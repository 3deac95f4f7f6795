"""Connecting this process to a Ray cluster as a driver, with a bounded wait.

``ray.init`` on an address where nothing listens keeps retrying for about a minute; users get a
clear :class:`~raytpu_lab.errors.ConnectError` within ``timeout_s`` instead, because we first probe
the address with a plain TCP connection.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray

from raytpu_lab.advice import cmd, opt
from raytpu_lab.errors import ConnectError

__all__ = ["connect", "probe", "disconnect", "wait_for_nodes", "split_address"]


def split_address(address: str) -> tuple[str, int]:
    """``"ray://host:10001"`` or ``"host:6379"`` -> ``(host, port)``.

    Raises:
        ConnectError: The address has no ``host:port`` part.
    """
    rest = address.strip().removeprefix("ray://")
    if "://" in rest:
        raise ConnectError(
            f"{address!r}: the {rest.split('://')[0]}:// scheme is not a Ray address.",
            why="Ray takes HOST:PORT (the GCS) or ray://HOST:PORT (Ray Client); the dashboard's "
                "http:// address is for job submission, not for a notebook driver.",
            fix=("For example: ", cmd("connect", "127.0.0.1:6379")), address=address)
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        raise ConnectError(
            f"{address!r} is not a Ray address.",
            why="A Ray address is HOST:PORT (the GCS, port 6379 on KubeRay) or ray://HOST:PORT "
                "(Ray Client, port 10001).",
            fix=("For example: ", cmd("connect", "127.0.0.1:6379")), address=address)
    return host, int(port)


_REFUSED_GRACE_S = 3.0


def probe(address: str, *, timeout_s: float = 15.0) -> None:
    """Check that something accepts TCP connections at ``address`` within ``timeout_s`` seconds.

    A refused connection (nothing listens on that port) is retried for
    ``min(3 s, timeout_s)`` only; timeouts and unreachable hosts for the whole ``timeout_s``.

    Raises:
        ConnectError: The address is malformed or nothing answered in time.
    """
    host, port = split_address(address)
    if timeout_s <= 0:
        raise ConnectError((opt("timeout", timeout_s), " is not allowed."), why="It must be above 0 s.",
                           fix=("Pass a positive timeout, e.g. ", opt("timeout", 15), "."),
                           address=address)
    start = time.monotonic()
    deadline = start + timeout_s
    last_error: OSError | None = None
    refused_since: float | None = None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic())):
                return
        except ConnectionRefusedError as err:
            # Nothing listens there. Give a head or a port-forward that is just starting a moment,
            # not the whole timeout.
            last_error = err
            refused_since = refused_since or time.monotonic()
            if time.monotonic() - refused_since >= min(_REFUSED_GRACE_S, timeout_s):
                break
        except OSError as err:
            last_error, refused_since = err, None
        time.sleep(0.25)
    waited = time.monotonic() - start
    raise ConnectError(
        f"Nothing answered at {address} within {waited:.0f} s.",
        why=f"TCP connection to {host}:{port} failed ({last_error}).",
        fix=("Check the address (GCS port 6379, Ray Client port 10001), that the cluster is up (",
             cmd("up"), " starts a local emulated one), or port-forward the head service."),
        address=address, timeout_s=timeout_s)


def connect(address: str, *, timeout_s: float = 15.0, namespace: str = "raytpu",
            ship_package: bool = False) -> None:
    """Connect this process to the Ray cluster at ``address``, replacing any earlier connection.

    Args:
        address: GCS address ``HOST:PORT`` or Ray Client address ``ray://HOST:PORT``.
        timeout_s: Seconds to wait for the address to answer.
        namespace: Ray namespace for named actors and detached placement groups.
        ship_package: Ship this raytpu_lab to every worker of the job (Ray's ``runtime_env``
            ``py_modules``, see :func:`job_runtime_env`): Ray Train workers run our report and
            log taps, which a cluster image (e.g. on GKE) need not have installed.

    Raises:
        ConnectError: Nothing accepted a connection at ``address`` within ``timeout_s`` seconds
            (the current connection, if any, is kept), or Ray refused to connect (message
            includes Ray's reason). A Ray Client proxy that failed to start this client's
            server is asked again first (up to 3 connections while ``timeout_s`` lasts).
    """
    deadline = time.monotonic() + timeout_s
    probe(address, timeout_s=timeout_s)
    if ray.is_initialized():
        ray.shutdown()
    for attempt in range(_CLIENT_SERVER_ATTEMPTS):
        try:
            ray.init(address=address, namespace=namespace, logging_level=logging.WARNING,
                     log_to_driver=True, configure_logging=True,
                     runtime_env=job_runtime_env(ship_package))
            return
        except Exception as err:  # Ray raises several unrelated types here: "not connected"
            if (_CLIENT_SERVER_FAILED in str(err) and attempt + 1 < _CLIENT_SERVER_ATTEMPTS
                    and time.monotonic() < deadline):
                # The head's Ray Client proxy starts one server process per client; on a
                # loaded head that start can fail (seen under load: "Starting Ray client
                # server failed"), and the next connection starts a fresh one.
                ray.shutdown()
                time.sleep(1.0)
                continue
            raise ConnectError(
                f"Ray could not connect to {address}.",
                why=f"{type(err).__name__}: {err}",
                fix="Make sure the notebook's Ray and Python versions match the cluster's.",
                address=address, timeout_s=timeout_s) from err


_CLIENT_SERVER_FAILED = "Starting Ray client server failed"
_CLIENT_SERVER_ATTEMPTS = 3


def job_runtime_env(ship_package: bool) -> dict[str, Any] | None:
    """The job's ``runtime_env``: with ``ship_package``, ``{"py_modules": [<raytpu_lab dir>]}``.

    Ray uploads the package once per job and puts it on every worker's path
    (https://docs.ray.io/en/latest/ray-core/handling-dependencies.html, ``py_modules``). Emulated
    clusters run from this machine's environment and need nothing.
    """
    if not ship_package:
        return None
    import raytpu_lab

    return {"py_modules": [str(Path(raytpu_lab.__file__).parent)]}


def disconnect() -> None:
    """Disconnect the driver; what it owned without ``lifetime="detached"`` is freed by Ray."""
    if ray.is_initialized():
        ray.shutdown()


def wait_for_nodes(count_alive: Callable[[], int], expected: int, timeout_s: float) -> int:
    """Poll ``count_alive()`` until it reaches ``expected`` or ``timeout_s`` seconds pass.

    Returns:
        The last count seen.
    """
    deadline = time.monotonic() + timeout_s
    seen = count_alive()
    while seen < expected and time.monotonic() < deadline:
        time.sleep(0.25)
        seen = count_alive()
    return seen
