"""MFU (pure): known FLOPs and step times give the expected utilisation; the emulator gives none."""

from __future__ import annotations

import pytest

from raytpu_lab.tpu.topology import parse_spec
from raytpu_lab.train.mfu import EMULATED_NOTE, PEAK_BF16_FLOPS, compute_mfu, peak_flops
from raytpu_lab.train.result import RunResult, RunUpdate


@pytest.mark.parametrize("version, peak", [
    ("v4", 275e12), ("v5e", 197e12), ("v5litepod", 197e12), ("v5p", 459e12), ("v6e", 918e12),
    ("v7x", 2307e12), ("tpu7x", 2307e12), ("v3", None)])
def test_peak_table(version: str, peak: float | None) -> None:
    assert peak_flops(version) == peak


def test_known_flops_and_step_time_give_the_expected_mfu() -> None:
    # 8 chips of v4, 1.1e15 FLOPs per step, 0.01 s per step: 1.375e16 FLOP/s per chip...
    m = compute_mfu(8 * 275e12 * 0.5 * 0.01, 0.01, chips=8, version="v4")
    assert m.flops_per_s_per_chip == pytest.approx(137.5e12)
    assert m.mfu == pytest.approx(0.5)
    assert m.text().startswith("MFU 50.0% (137.5 TFLOP/s per chip of 275.0 TFLOP/s bf16 peak")


def test_on_cpu_devices_the_flops_are_shown_with_a_note_instead_of_a_percentage() -> None:
    m = compute_mfu(2e9, 0.5, chips=4, version="v6e", emulated=True)
    assert m.mfu is None and m.flops_per_s_per_chip == pytest.approx(1e9)
    assert m.text() == f"1.0 GFLOP/s per chip; {EMULATED_NOTE}"
    assert "%" not in m.text()


def test_missing_inputs_are_said_and_bad_ones_refused() -> None:
    assert "FLOPs per step unknown" in compute_mfu(None, 0.1, chips=4, version="v4").text()
    assert "no step time" in compute_mfu(1e9, None, chips=4, version="v4").text()
    assert "no bf16 peak known for v3" in compute_mfu(1e9, 1.0, chips=4, version="v3").text()
    with pytest.raises(ValueError, match="negative"):
        compute_mfu(-1.0, 1.0, chips=4, version="v4")


def test_a_run_takes_flops_from_the_user_or_its_reports_and_steps_per_s_for_time() -> None:
    rows = [{"report": i, "rank": 0, "time_s": 10.0 + i, "step": 10 * i, "flops_per_step": 3e12}
            for i in range(3)]  # 10 steps per second
    run = RunResult(name="m", shape=parse_spec("v5p:2x2x2"), num_slices=1, records=rows)
    from_xla = run.mfu()
    assert from_xla.source == "xla" and from_xla.step_s == pytest.approx(0.1)
    assert from_xla.mfu == pytest.approx(3e12 / 0.1 / 8 / PEAK_BF16_FLOPS["v5p"])
    assert run.mfu(flops_per_step=6e12).mfu == pytest.approx(2 * from_xla.mfu)
    run.flops_per_step = 1.5e12
    assert run.mfu().source == "user" and run.mfu().mfu == pytest.approx(from_xla.mfu / 2)
    run.absorb(RunUpdate(elapsed_s=1.0, timings=[{
        "kind": "timing", "rank": 0, "process_start": None, "fn_start": 0.0, "fn_end": 1.0,
        "reports": [], "cpu_devices": True}]))
    assert run.mfu().mfu is None and EMULATED_NOTE in run.summary()["mfu"]["note"]


def test_the_config_key_is_the_users_flops_per_step() -> None:
    from raytpu_lab.train.launch import user_flops

    assert user_flops({"flops_per_step": 2e12, "steps": 5}) == 2e12
    assert user_flops({"steps": 5}) is None and user_flops(None) is None
    assert user_flops({"flops_per_step": True}) is None
