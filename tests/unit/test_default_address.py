"""``%raytpu connect`` with no address: $RAY_ADDRESS, else the one emulated cluster running here."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from raytpu_lab.errors import ConnectError
from raytpu_lab.session import connection as connection_module


def _clusters(monkeypatch: pytest.MonkeyPatch, *addresses: str) -> None:
    found = [SimpleNamespace(name=f"c{i}", address=a) for i, a in enumerate(addresses)]
    monkeypatch.setattr(connection_module.emulator, "running", lambda: found)


def test_ray_address_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    _clusters(monkeypatch, "127.0.0.1:6000")
    assert connection_module.default_address() == "10.0.0.5:6379"


def test_the_one_running_emulated_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    _clusters(monkeypatch, "127.0.0.1:6000")
    assert connection_module.default_address() == "127.0.0.1:6000"


def test_several_clusters_are_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    _clusters(monkeypatch, "127.0.0.1:6000", "127.0.0.1:7000")
    with pytest.raises(ConnectError, match="2 emulated clusters") as err:
        connection_module.default_address()
    assert "c0 at 127.0.0.1:6000; c1 at 127.0.0.1:7000" in str(err.value)


def test_nothing_to_connect_to_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    _clusters(monkeypatch)
    with pytest.raises(ConnectError, match="No Ray cluster to connect to") as err:
        connection_module.default_address()
    assert "lab.up()" in err.value.fix and "lab.connect_kuberay('NAME')" in err.value.fix
    cell = err.value.spelled("cell")
    assert "%raytpu up" in cell and "%raytpu connect --kuberay NAME" in cell


def test_a_refused_connection_fails_in_seconds_not_the_whole_timeout() -> None:
    import socket
    import time

    from raytpu_lab.cluster.connect import probe

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(ConnectError, match="Connection refused"):
        probe(f"127.0.0.1:{port}", timeout_s=15)
    assert time.monotonic() - start < 6
