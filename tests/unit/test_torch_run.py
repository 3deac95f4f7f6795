"""PyTorch/XLA runs, the parts without a cluster: checks before launch, backend choice, the XLA
profile and recompilation storms, the result's views of the records."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from raytpu_lab.cluster.gke_env import EMULATED_LABEL
from raytpu_lab.errors import NotConnectedError, TrainingConfigError
from raytpu_lab.state.model import build_snapshot
from raytpu_lab.tpu.topology import SliceShape
from raytpu_lab.train import torch_checks
from raytpu_lab.train.torch_checks import (
    TORCH_EXTRA,
    check_backend,
    check_torch_versions,
    workers_per_run,
)
from raytpu_lab.train.torch_run import TorchRunResult, is_emulated, resolve_backend
from raytpu_lab.train.worker_tap import accepts_config
from raytpu_lab.train.xla_profile import recompilation_storm, xla_metrics_by_rank
from raytpu_lab.widgets.xla_view import XlaMetricsView

FIXTURES = Path(__file__).parent / "fixtures"


# --- torch / torch_xla installed and matching ------------------------------------------------

@pytest.mark.parametrize("versions, missing", [
    ((None, "2.9.0"), "torch"), (("2.9.0", None), "torch_xla"), ((None, None), "torch and torch_xla"),
])
def test_missing_torch_is_one_line_naming_the_extra(versions, missing) -> None:
    with pytest.raises(TrainingConfigError) as err:
        check_torch_versions(*versions)
    text = str(err.value)
    assert "\n" not in text
    assert f"need {missing}," in text and TORCH_EXTRA in text


@pytest.mark.parametrize("torch_v, xla_v", [("2.8.0", "2.9.0"), ("2.9.0+cu128", "2.10.0"),
                                            ("3.0.0", "2.9.0")])
def test_mismatched_versions_are_explained(torch_v: str, xla_v: str) -> None:
    with pytest.raises(TrainingConfigError) as err:
        check_torch_versions(torch_v, xla_v)
    e = err.value
    assert torch_v in e.what and xla_v in e.what
    assert "_XLAC" not in e.what and "built against" in e.why and "torch==" in e.fix


@pytest.mark.parametrize("torch_v, xla_v", [("2.9.0", "2.9.0"), ("2.9.0+cu128", "2.9.0"),
                                            ("2.9.1", "2.9.0"), ("2.9.0+cpu", "2.9.0rc1")])
def test_matching_versions_pass(torch_v: str, xla_v: str) -> None:
    check_torch_versions(torch_v, xla_v)


@pytest.mark.parametrize("module", ["raytpu_lab.train.torch_checks", "raytpu_lab.train.xla_profile",
                                    "raytpu_lab.train.torch_xla_utils"])
def test_checks_and_helpers_load_neither_torch_nor_ray(module: str) -> None:
    code = (f"import sys, {module} as m, raytpu_lab.train.torch_checks as c; c.installed_versions(); "
            "print(sorted(x for x in ('torch', 'torch_xla', 'ray') if x in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- workers, backend, signature ------------------------------------------------------------

@pytest.mark.parametrize("spec, slices, per_worker, workers", [
    ("v5p:2x2x2", 1, 1, 8), ("v5p:2x2x2", 2, 1, 16), ("v5p:2x2x2", 1, 2, 4),
    ("v5p:2x2x2", 1, 4, 2), ("v6e:4x4", 1, 1, 16), ("v5litepod:2x2", 1, 1, 4),
])
def test_one_worker_per_chip(spec: str, slices: int, per_worker: int, workers: int) -> None:
    version, topology = spec.split(":")
    assert workers_per_run(SliceShape.of(version, topology), slices, per_worker) == workers


@pytest.mark.parametrize("per_worker", [3, 0, 8])
def test_chips_per_worker_must_divide_a_host(per_worker: int) -> None:
    with pytest.raises(TrainingConfigError) as err:
        workers_per_run(SliceShape.of("v5p", "2x2x2"), 1, per_worker)
    assert f"has 8 chips, 4 per host; {per_worker} TPU chip(s) per worker" in str(err.value)


def test_unknown_backend_is_refused() -> None:
    with pytest.raises(TrainingConfigError, match="nccl"):
        check_backend("nccl")
    for ok in (None, "xla", "tpu_dist", "gloo"):
        check_backend(ok)


@pytest.mark.parametrize("requested, emulated, expected", [
    (None, False, ("xla", "TPU")), ("xla", False, ("xla", "TPU")),
    ("tpu_dist", False, ("tpu_dist", "TPU")), ("gloo", False, ("gloo", "TPU")),
    (None, True, ("gloo", "CPU")), ("xla", True, ("gloo", "CPU")), ("tpu_dist", True, ("gloo", "CPU")),
])
def test_backend_follows_the_cluster_not_the_cell(requested, emulated, expected) -> None:
    assert resolve_backend(requested, emulated) == expected


def _f0() -> None: ...
def _f1(config) -> None: ...
def _f_default(config=None) -> None: ...
def _f_var(*args) -> None: ...
def _f2(config, extra) -> None: ...
def _f_kw(*, config) -> None: ...


# Ray Train counts *required* parameters (ray.train._internal.utils.count_required_parameters):
# f(config=None) is called as f(), in a torch run as in a JAX run.
@pytest.mark.parametrize("fn, expected", [(_f0, False), (_f1, True), (_f_default, False),
                                          (_f_var, True), (lambda c: None, True)])
def test_signatures_ray_train_can_call(fn, expected: bool) -> None:
    assert accepts_config(fn) is expected


@pytest.mark.parametrize("fn", [_f2, _f_kw, 42])
def test_wrong_signature_is_refused(fn) -> None:
    with pytest.raises(TrainingConfigError) as err:
        accepts_config(fn)
    assert "f(config)" in str(err.value)


def test_lab_refuses_before_it_needs_a_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bad input fails before the connection check: nothing can have been taken."""
    from raytpu_lab.lab import Lab

    lab = Lab()
    with pytest.raises(NotConnectedError):  # good input gets as far as the connection check
        lab.train_torch(_f1, "2x2x2", "v5p")
    with pytest.raises(TrainingConfigError, match="3 TPU chip"):
        lab.train_torch(_f1, "2x2x2", "v5p", chips_per_worker=3)
    with pytest.raises(TrainingConfigError, match="cannot be the per-worker"):
        lab.train_torch(_f2, "2x2x2", "v5p")
    monkeypatch.setattr(torch_checks.metadata, "version", _no_torch)
    with pytest.raises(TrainingConfigError, match=r"raytpu_lab\[torch\]"):
        lab.train_torch(_f1, "2x2x2", "v5p")


def _no_torch(name: str) -> str:
    raise torch_checks.metadata.PackageNotFoundError(name)


# --- emulated or real, from the cluster -------------------------------------------------------

def test_emulated_slices_are_told_by_their_node_label() -> None:
    raw = json.loads((FIXTURES / "raw_v6e_4x4_x2_idle.json").read_text())
    shape = SliceShape.of("v6e", "4x4")
    assert not is_emulated(build_snapshot(raw), shape)  # recorded before the label: as on GKE
    marked = copy.deepcopy(raw)
    for node in marked["nodes"]:
        if not node["is_head"]:
            node["labels"][EMULATED_LABEL] = "true"
    assert is_emulated(build_snapshot(marked), shape)
    assert not is_emulated(build_snapshot(marked), SliceShape.of("v5p", "2x2x2"))


# --- recompilation storms ---------------------------------------------------------------------

@pytest.mark.parametrize("counts, storm", [
    ([], False),
    ([4] * 8, False),                               # everything compiled in the first step
    ([2, 3, 4, 4, 4, 4, 4, 4], False),              # warm-up compiles only
    ([2, 4, 6, 8, 8, 8, 8, 8, 8, 8], False),        # two late-ish compiles, then settled
    ([2, 3, 4, 4, 4, 4, 4, 5], False),              # one stray compile is not a storm
    ([1, 2, 3, 4, 5, 6, 7, 8], True),               # a compile every step
    ([2, 3, 4, 4, 4, 4, 6, 7], True),               # growing again at the end
    ([3, 3, 3, 5], True),                           # one step after warm-up, two compiles in it
])
def test_recompilation_storm(counts: list[int], storm: bool) -> None:
    trend = recompilation_storm(counts, warmup_steps=3)
    assert trend.storm is storm, trend
    assert trend.steps == len(counts)
    if counts:
        assert trend.warmup_compiles + trend.later_compiles == counts[-1]
    assert ("keep changing" in trend.reason) is storm


# --- the result -------------------------------------------------------------------------------

def _records() -> list[dict[str, Any]]:
    return [{"report": step, "rank": rank, "time_s": 2.0 + step, "step": step,
             "loss": 1.0 / (step + 1)} for step in range(4) for rank in range(2)]


def _workers() -> list[dict[str, Any]]:
    """The worker tap's placement rows: rank 1's worker group restarted once."""
    row = {"kind": "placement", "slice": "s0", "worker_id": 0, "node_id": "n0", "host": "10.0.0.1"}
    return [{**row, "rank": 0, "chips": ["0"]}, {**row, "rank": 1, "chips": ["3"]},
            {**row, "rank": 1, "chips": ["1"]}]


def _summaries() -> dict[int, dict[str, Any]]:
    return {rank: {"xla_compile_count": 4 + 4 * rank, "xla_compile_time_s": 0.5,
                   "xla_compiles_per_step": [4, 4, 4, 4] if rank == 0 else [2, 4, 6, 8]}
            for rank in range(2)}


def test_torch_result_reads_placement_and_xla_metrics_apart_from_the_reports() -> None:
    run = TorchRunResult(name="r", shape=SliceShape.of("v5p", "2x2x2"), num_slices=1,
                         records=_records(), workers=_workers(), worker_summaries=_summaries(),
                         backend="gloo", pjrt_device="CPU")
    assert run.num_workers == 8
    assert run.steps == 4 and run.metric("loss") == [1.0, 0.5, 1 / 3, 0.25]
    assert run.steps_per_s == pytest.approx(1.0)
    assert run.final_metrics == {"step": 3, "loss": 0.25}
    assert run.chip_placement == {0: {"slice": "s0", "host": 0, "chip": 0, "node_id": "n0"},
                                  1: {"slice": "s0", "host": 0, "chip": 1, "node_id": "n0"}}
    assert run.xla_metrics[1]["xla_compile_count"] == 8
    assert xla_metrics_by_rank({0: {"other": 1}, 2: {"xla_execute_count": 3}}) == {
        2: {"xla_execute_count": 3}}
    s = run.summary()
    assert (s["backend"], s["pjrt_device"], s["xla_compiles"]) == ("gloo", "CPU", 4)
    assert s["recompilation_storm"] == [1]
    assert json.loads(json.dumps(s)) == s


def test_xla_panel_shows_every_rank_and_flags_the_storm() -> None:
    run = TorchRunResult(name="r", shape=SliceShape.of("v5p", "2x2x2"), num_slices=1,
                         records=_records(), workers=_workers(), worker_summaries=_summaries())
    view = XlaMetricsView.of(run)
    assert view.storm_ranks == [1]
    assert view.headline().startswith("Recompilation storm on rank(s) 1: 2 compiles after the 3-step")
    text = view.text().splitlines()
    assert text[2].split()[:5] == ["0", "s0", "host", "0", "chip"] and "STORM" not in text[2]
    assert text[3].endswith("2 (2 late) STORM")
    html = view.html()
    assert html.count("<tr") == 3 and html.count("color:#d93025;font-weight:bold") == 1
    assert "4 / 0.500 s" in html and "8 / 0.500 s" in html


def test_xla_panel_says_when_workers_sent_nothing() -> None:
    view = XlaMetricsView({}, {})
    assert "No torch_xla metrics" in view.text() and "<tr><th>rank" in view.html()
