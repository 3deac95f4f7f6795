"""The run service alone, around a fake state reader and a fake trainer: the one run path every
trainer takes (checks first, then the connection, the slices, the launch and the bookkeeping).

No Ray: the snapshot is built from a synthetic raw state, the trainer table holds a stand-in
that records what it was asked to start."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from raytpu_lab.errors import (
    NotConnectedError,
    RaytpuError,
    ReservationError,
    TrainingConfigError,
)
from raytpu_lab.state.model import build_snapshot
from raytpu_lab.state.synthetic import synthetic_raw_state
from raytpu_lab.tpu.topology import SliceShape
from raytpu_lab.train.result import RunResult
from raytpu_lab.train.service import TRAINERS, Runs
from raytpu_lab.train.spec import RunSpec, validate


def train(config):
    pass


class _Fake:
    """The session's side of the service, and a trainer factory that records its calls."""

    def __init__(self, connected: bool = True) -> None:
        self.connected = connected
        self.calls: list[str] = []
        self.placed: list[tuple[str, list[str], list[str], int]] = []
        self.ended: list[str] = []
        self.started: list[dict[str, Any]] = []
        self.snap = build_snapshot(synthetic_raw_state([("v4:2x2x2", 2)]))

    def snapshot(self):
        self.calls.append("snapshot")
        return self.snap

    def require_connection(self, doing: str) -> None:
        self.calls.append("connection")
        if not self.connected:
            raise NotConnectedError(f"Cannot {doing}: no Ray cluster is connected.")

    def reservation(self, name: str):
        if name != "mine":
            raise ReservationError(f"No reservation named {name!r} in this session.")
        return SimpleNamespace(name="mine", shape=SliceShape.of("v4", "2x2x2"),
                               slice_names=["tpu-v4-2x2x2-0"])

    def factory(self, run, name, *, snapshot, **kwargs):
        self.started.append({"run": run, "name": name, **kwargs})
        return SimpleNamespace(result=RunResult(name, run.shape, run.spec.slices), failure=None,
                               stop=lambda: True)

    def runs(self) -> Runs:
        return Runs(self.snapshot, self.require_connection, reservation=self.reservation,
                    held=lambda: ["mine"], release_hosts=lambda name: None,
                    on_placed=lambda *a: self.placed.append(a),
                    on_ended=self.ended.append,
                    trainers={"jax": self.factory, "torch": self.factory})


def test_every_trainer_kind_has_a_factory() -> None:
    assert set(TRAINERS) == {"jax", "torch"}


@pytest.mark.parametrize(("spec", "error", "needle"), [
    (RunSpec("jax", "4x5", "v6e", train), RaytpuError, "not a valid topology"),
    (RunSpec("jax", "2x2x2", "v4", train, slices=0), RaytpuError, "slices=0 is not allowed"),
    (RunSpec("jax", "2x2x2", "v4", train, profile="8:5"), TrainingConfigError, "8:5"),
    (RunSpec("torch", "2x2x2", "v4", train, profile="x"), TrainingConfigError, "START:STOP"),
    (RunSpec("jax", "2x2x2", "v4", train, config=[1]), TrainingConfigError, "not a dict"),
    (RunSpec("torch", "2x2x2", "v5p", train, chips_per_worker=3), TrainingConfigError, "divide"),
    (RunSpec("torch", "2x2x2", "v5p", train, backend="nccl"), TrainingConfigError, "nccl"),
    (RunSpec("jax", "2x2x2", "v4", lambda a, b: None), TrainingConfigError, "cannot be"),
])
def test_a_bad_spec_is_refused_before_the_connection_is_even_checked(spec, error, needle) -> None:
    fake = _Fake()
    with pytest.raises(error, match=needle.replace("(", r"\(")):
        fake.runs().start(spec)
    assert fake.calls == [] and fake.started == []


def test_validate_counts_workers_per_trainer() -> None:
    assert validate(RunSpec("jax", "2x2x2", "v4", slices=2)).num_workers == 4  # per host
    assert validate(RunSpec("torch", "2x2x2", "v5p", chips_per_worker=2)).num_workers == 4


def test_no_connection_no_launch() -> None:
    fake = _Fake(connected=False)
    with pytest.raises(NotConnectedError):
        fake.runs().start(RunSpec("jax", "2x2x2", "v4", train, name="x"))
    assert fake.started == []


def test_a_run_on_idle_slices_is_started_and_its_books_kept() -> None:
    fake = _Fake()
    runs = fake.runs()
    launched: list[bool] = []
    handle = runs.start(RunSpec("torch", "2x2x2", "v4", train, name="t1", slices=2,
                                profile=None), on_launch=lambda: launched.append(True))
    (call,) = fake.started
    assert launched == [True] and call["name"] == "t1" and call["run"].spec.trainer == "torch"
    # No on_records, no listener: only the run board (the Lab sidebar's list and Stop) listens.
    assert [type(x).__name__ for x in call["listeners"]] == ["RunBoard"]
    call["on_placement"](["s0", "s1"], ["pg1"])
    assert fake.placed == [("run t1", ["s0", "s1"], ["pg1"], 2)]
    call["on_finish"](handle)
    assert fake.ended == ["run t1"] and runs.last_run is handle.result


def test_a_reservation_must_exist_and_match() -> None:
    fake = _Fake()
    with pytest.raises(ReservationError, match="No reservation named 'ghost'"):
        fake.runs().start(RunSpec("torch", "2x2x2", "v4", train, reservation="ghost"))
    with pytest.raises(ReservationError, match="not 2 x v4-16"):
        fake.runs().start(RunSpec("jax", "2x2x2", "v4", train, slices=2, reservation="mine"))
    assert fake.started == []
