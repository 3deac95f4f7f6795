"""The session's services built around a fake state reader (synthetic raw states, no Ray cluster):
the reservation book and the connection, and the session facade over them."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from raytpu_lab.errors import (
    EmulatorError,
    InvalidTopologyError,
    NotConnectedError,
    RaytpuError,
    ReservationError,
)
from raytpu_lab.lab import Session
from raytpu_lab.reservations.service import ReservationService, no_reservation_error
from raytpu_lab.session import connection as connection_module
from raytpu_lab.session.connection import Connection
from raytpu_lab.session.reader import SnapshotContext, StateReader
from raytpu_lab.state.synthetic import synthetic_raw_state
from raytpu_lab.tpu.topology import SliceShape


@dataclass
class FakeReader:
    """Records what was read; serves ``raw`` and ``lifetimes`` as given."""

    raw_state: dict[str, Any]
    lifetimes_of: dict[str, dict[str, Any]] = field(default_factory=dict)
    is_connected: bool = True
    reads: list[str] = field(default_factory=list)

    def reader(self) -> StateReader:
        def raw() -> dict[str, Any]:
            self.reads.append("raw")
            return self.raw_state

        def lifetimes() -> dict[str, dict[str, Any]]:
            self.reads.append("lifetimes")
            return self.lifetimes_of

        return StateReader(raw=raw, lifetimes=lifetimes, alive_nodes=lambda: 0,
                           connected=lambda: self.is_connected)


@dataclass
class FakeReservation:
    name: str
    slice_names: list[str]
    detached: bool = False
    shape: SliceShape = field(default_factory=lambda: SliceShape.of("v4", "2x2x2"))
    released: int = 0

    def release(self) -> None:
        self.released += 1


def _placed_group(raw: dict[str, Any], name: str, slice_name: str, pg_id: str) -> dict[str, Any]:
    """``raw`` plus a placement group ``raytpu:<name>`` with a bundle on each host of the slice."""
    hosts = [n for n in raw["nodes"] if n["labels"].get("ray.io/tpu-slice-name") == slice_name]
    group = {"placement_group_id": pg_id, "name": f"raytpu:{name}", "state": "CREATED",
             "bundles": [{"index": i, "node_id": n["node_id"], "resources": {"TPU": 4.0}}
                         for i, n in enumerate(hosts)]}
    return {**raw, "placement_groups": [*raw["placement_groups"], group]}


RAW = synthetic_raw_state([("v4:2x2x2", 2)])


def test_the_one_unknown_reservation_error_lists_what_is_held() -> None:
    book = ReservationService(FakeReader(RAW).reader())
    book.held["r1"] = FakeReservation("r1", ["tpu-v4-2x2x2-0"])  # type: ignore[assignment]
    with pytest.raises(ReservationError, match="No reservation named 'ghost' in this session") as err:
        book.get("ghost")
    assert "Reservations held: r1." in str(err.value)
    assert "Reservations held: none." in str(no_reservation_error("x", []))


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"topology": "4x5", "version": "v6e"}, "is not a valid topology"),
    ({"slices": 0}, "slices=0 is not allowed"),
    ({"timeout_s": math.nan}, "timeout_s=nan is not allowed"),
    ({"name": "two words"}, "is not a reservation name"),
])
def test_reserve_refuses_before_reading_the_cluster(kwargs: dict[str, Any], needle: str) -> None:
    fake = FakeReader(RAW)
    book = ReservationService(fake.reader())
    args = {"topology": "2x2x2", "version": "v4", **kwargs}
    with pytest.raises((RaytpuError, InvalidTopologyError), match=needle):
        book.reserve(args.pop("topology"), args.pop("version"), **args)
    assert fake.reads == [] and book.held == {}


def test_reserve_without_a_cluster_says_how_to_connect() -> None:
    fake = FakeReader(RAW, is_connected=False)
    with pytest.raises(NotConnectedError, match="Cannot reserve a slice"):
        ReservationService(fake.reader()).reserve("2x2x2", "v4")
    assert fake.reads == []


def test_a_taken_name_is_refused() -> None:
    book = ReservationService(FakeReader(RAW).reader())
    book.held["r1"] = FakeReservation("r1", ["tpu-v4-2x2x2-0"])  # type: ignore[assignment]
    with pytest.raises(ReservationError, match="A reservation named 'r1' exists already"):
        book.reserve("2x2x2", "v4", name="r1")


def test_release_closes_hosts_first_and_settles_on_an_idle_snapshot() -> None:
    closed: list[str] = []
    book = ReservationService(FakeReader(RAW).reader(), on_release=closed.append)
    res = FakeReservation("r1", ["tpu-v4-2x2x2-0"])
    book.held["r1"] = res  # type: ignore[assignment]
    book.release("r1", settle_s=5.0)
    assert closed == ["r1"] and res.released == 1 and book.held == {}


def test_release_of_an_unknown_name_looks_for_a_detached_one_then_refuses() -> None:
    fake = FakeReader(RAW)
    with pytest.raises(ReservationError, match="No reservation named 'nope'"):
        ReservationService(fake.reader()).release("nope")
    assert "lifetimes" in fake.reads  # the cluster's reservations were read


def test_attach_explains_a_reservation_of_the_default_lifetime() -> None:
    raw = _placed_group(RAW, "r9", "tpu-v4-2x2x2-1", "pg9")
    fake = FakeReader(raw, {"pg9": {"is_detached": False, "creator_job_id": "02000000"}})
    book = ReservationService(fake.reader())
    with pytest.raises(ReservationError, match="No detached reservation named 'r9'") as err:
        book.attach("r9")
    assert "default lifetime" in str(err.value) and book.held == {}


def test_release_all_keeps_detached_ones_at_kernel_exit() -> None:
    closed: list[str] = []
    book = ReservationService(FakeReader(RAW).reader(), on_release=closed.append)
    mine, kept = FakeReservation("a", ["s0"]), FakeReservation("b", ["s1"], detached=True)
    book.held.update({"a": mine, "b": kept})  # type: ignore[dict-item]
    assert book.own_slices() == {"s0", "s1"}
    book.release_all(keep_detached=True)
    assert (mine.released, kept.released, closed, book.held) == (1, 0, ["a", "b"], {})


def test_the_reader_adds_the_sessions_context_to_the_snapshot() -> None:
    reader = FakeReader(_placed_group(RAW, "r1", "tpu-v4-2x2x2-0", "pg1")).reader()
    reader.context = lambda: SnapshotContext(jobs={"pg1": "run mnist"})
    snap = reader.snapshot()
    assert snap.slice("tpu-v4-2x2x2-0").owners == ["run mnist"]
    assert [r.name for r in reader.reservations()] == ["r1"]


def test_a_session_over_a_fake_reader_reads_no_ray() -> None:
    fake = FakeReader(RAW)
    session = Session(fake.reader())
    assert [s.name for s in session.snapshot().idle_slices("v4-16")] == [
        "tpu-v4-2x2x2-0", "tpu-v4-2x2x2-1"]
    assert session.cluster_reservations() == []
    assert session.status().snapshot.slices
    session.reservation_service.held["r1"] = FakeReservation("r1", ["tpu-v4-2x2x2-0"])  # type: ignore[assignment]
    assert session.feed.own_slices() == {"tpu-v4-2x2x2-0"}


# -- connection --------------------------------------------------------------------------


class FakeCluster:
    def __init__(self, name: str = "raytpu", hosts: int = 4, holds: bool = True) -> None:
        self.name, self.address, self.client_port = name, f"127.0.0.1:{6000 + hosts}", 10001
        self.hosts = [SimpleNamespace(slice_name=f"s{i // 2}") for i in range(hosts)]
        self._holds, self.stopped = holds, 0
        self.folder = connection_module.Path("/tmp/nowhere")

    def holds(self, specs: list[tuple[str, int]]) -> bool:
        return self._holds

    def is_running(self) -> bool:
        return self.stopped == 0

    def down(self, timeout_s: float = 0.0) -> None:
        self.stopped += 1


@pytest.fixture()
def no_ray(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The connection's calls to Ray and the emulator, recorded instead of made."""
    calls: list[str] = []
    monkeypatch.setattr(connection_module, "probe", lambda a, timeout_s: calls.append(f"probe {a}"))
    monkeypatch.setattr(connection_module, "connect",
                        lambda a, timeout_s, ship_package: calls.append(f"connect {a}"))
    monkeypatch.setattr(connection_module, "disconnect", lambda: calls.append("disconnect"))
    monkeypatch.setattr(connection_module._ray_private, "enable_token_auth", lambda: None)
    monkeypatch.setattr(connection_module.ray, "is_initialized", lambda: True)
    return calls


def test_up_joins_a_running_cluster_that_holds_the_shape(no_ray: list[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    running = FakeCluster()
    monkeypatch.setattr(connection_module.emulator, "find", lambda name: running)
    monkeypatch.setattr(connection_module.emulator, "running", lambda: [running])
    switched: list[int] = []
    reader = StateReader(alive_nodes=lambda: 5)  # 4 hosts and the head
    conn = Connection(reader, on_switch=lambda: switched.append(1))
    assert conn.up("v4:2x2x2", 2) is running
    assert conn.started is None and conn.cluster is running and conn.connected
    assert switched == [1] and f"connect {running.address}" in no_ray
    assert conn.down() is None and running.stopped == 0  # joined, so left running


def test_up_stops_what_it_started_when_hosts_do_not_join(no_ray: list[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    started = FakeCluster(holds=False)
    monkeypatch.setattr(connection_module.emulator, "find", lambda name: None)
    monkeypatch.setattr(connection_module.emulator, "running", lambda: [started])
    monkeypatch.setattr(connection_module.emulator, "up", lambda specs, **kw: started)
    monkeypatch.setattr(connection_module, "_NODE_JOIN_TIMEOUT_S", 0.3)
    conn = Connection(StateReader(alive_nodes=lambda: 2))
    with pytest.raises(EmulatorError, match="Only 2 of 5 emulated nodes joined"):
        conn.up("v4:2x2x2", 2)
    assert started.stopped == 1 and conn.address is None and conn.started is None


def test_up_refuses_a_bad_spec_before_anything(no_ray: list[str]) -> None:
    with pytest.raises(InvalidTopologyError):
        Connection(StateReader()).up("v6e:4x5")
    assert no_ray == []


def test_connect_refuses_a_bad_timeout_and_keeps_the_connection(no_ray: list[str]) -> None:
    switched: list[int] = []
    conn = Connection(StateReader(), on_switch=lambda: switched.append(1))
    with pytest.raises(RaytpuError, match="timeout_s=0 is not allowed"):
        conn.connect("127.0.0.1:1", timeout_s=0)
    assert no_ray == [] and switched == []


def test_down_of_a_name_that_does_not_run_lists_those_that_do(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection_module.emulator, "find", lambda name: None)
    monkeypatch.setattr(connection_module.emulator, "running", lambda: [FakeCluster("other")])
    with pytest.raises(EmulatorError, match="No emulated cluster named 'nosuch'") as err:
        Connection(StateReader()).check_stoppable("nosuch")
    assert "Name one that runs: other." in err.value.fix


def test_down_stops_the_cluster_up_started(no_ray: list[str]) -> None:
    conn = Connection(StateReader())
    conn.started = conn.cluster = started = FakeCluster()  # type: ignore[assignment]
    conn.address = started.address
    assert conn.down() == "raytpu" and started.stopped == 1
    assert conn.down() is None and "disconnect" in no_ray  # idempotent


def test_use_session_puts_a_session_in_place_for_the_magics_and_restores_the_last() -> None:
    from raytpu_lab import lab as lab_module

    before = lab_module._LAB
    mine = Session(FakeReader(RAW).reader())
    with lab_module.use_session(mine) as session:
        assert session is mine and lab_module.get_lab() is mine
    assert lab_module._LAB is before
    assert lab_module.Lab is Session


def test_check_refuses_bad_input_before_reading_the_cluster() -> None:
    from raytpu_lab.session.hosts import HostSessions

    fake = FakeReader(RAW)
    hosts = HostSessions(ReservationService(fake.reader()))
    with pytest.raises(RaytpuError, match="timeout_s=0 is not allowed"):
        hosts.check("r1", timeout_s=0)
    with pytest.raises(ReservationError, match="No reservation named 'r1'"):
        hosts.check("r1")
    assert fake.reads == [] and hosts.sessions == {}
    offline = FakeReader(RAW, is_connected=False)
    with pytest.raises(NotConnectedError, match="Cannot check the hosts"):
        HostSessions(ReservationService(offline.reader())).check()
    assert offline.reads == []
