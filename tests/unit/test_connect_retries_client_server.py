"""``connect`` asks a Ray Client proxy again when it failed to start this client's server.

On a loaded head Ray's proxy (``ray/util/client/server/proxier.py``) can fail to start the
per-client server ("Starting Ray client server failed"); a second connection starts a fresh one.
Other refusals are not retried: they say what is wrong (versions, auth) at once.
"""

from __future__ import annotations

import pytest

from raytpu_lab.cluster import connect as connect_module
from raytpu_lab.errors import ConnectError

FAILED = ("Initialization failure from server:\nRuntimeError: Starting Ray client server failed. "
          "See ray_client_server_23000.err for detailed logs.")


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    monkeypatch.setattr(connect_module, "probe", lambda address, timeout_s: None)
    monkeypatch.setattr(connect_module.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(connect_module.ray, "shutdown", lambda: None)
    monkeypatch.setattr(connect_module.time, "sleep", lambda s: None)
    return seen


def _init_failing(times: int, message: str, seen: list[str]):  # type: ignore[no-untyped-def]
    def init(**kwargs):  # type: ignore[no-untyped-def]
        seen.append(kwargs["address"])
        if len(seen) <= times:
            raise ConnectionAbortedError(message)
    return init


def test_a_client_server_that_failed_to_start_is_asked_again(calls, monkeypatch) -> None:
    monkeypatch.setattr(connect_module.ray, "init", _init_failing(2, FAILED, calls))
    connect_module.connect("ray://127.0.0.1:10001", timeout_s=30)
    assert calls == ["ray://127.0.0.1:10001"] * 3


def test_it_gives_up_after_three_connections_with_ray_s_reason(calls, monkeypatch) -> None:
    monkeypatch.setattr(connect_module.ray, "init", _init_failing(5, FAILED, calls))
    with pytest.raises(ConnectError, match="could not connect") as err:
        connect_module.connect("ray://127.0.0.1:10001", timeout_s=30)
    assert len(calls) == 3 and "Starting Ray client server failed" in str(err.value)


def test_another_refusal_is_not_retried(calls, monkeypatch) -> None:
    monkeypatch.setattr(connect_module.ray, "init", _init_failing(5, "version mismatch", calls))
    with pytest.raises(ConnectError, match="version mismatch"):
        connect_module.connect("ray://127.0.0.1:10001", timeout_s=30)
    assert len(calls) == 1
