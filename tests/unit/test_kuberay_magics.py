"""%raytpu connect --kuberay / apply / scale / delete, in-process, against the local Kubernetes
API STAND-IN (``tests/k8s_standin.py``; no real cluster, no Ray started).

Bad input prints one short block (what, why, what to do) and never a token or certificate.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.testing.globalipapp import start_ipython
from IPython.utils.capture import capture_output

import raytpu_lab.lab as lab_module
from raytpu_lab.kuberay import build_raycluster, dump_manifest
from raytpu_lab.lab import Lab
from raytpu_lab.magics.parser import HelpShown, build_parser

from ..k8s_standin import SECRETS, KubeStandIn, ready_status, running_standin, write_kubeconfig

NS = "ml"


@pytest.fixture(scope="module")
def ip():
    from IPython import get_ipython

    shell = start_ipython() or get_ipython()  # None when another test started it already
    shell.run_line_magic("load_ext", "raytpu_lab")
    return shell


@pytest.fixture()
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubeStandIn]:
    with running_standin() as s:
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "config", s.url, namespace=NS)))
        with lab_module.use_session(Lab()):
            yield s


def _run(ip, line: str) -> tuple[str, object]:
    with capture_output() as out:
        result = ip.run_cell(f"%raytpu {line}", store_history=False)
    return out.stdout + out.stderr, result.error_in_exec


@pytest.mark.parametrize("command", ["apply", "scale", "delete", "connect", "up"])
def test_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(HelpShown):
        build_parser().parse_args([command, "--help"])
    assert f"raytpu {command}" in capsys.readouterr().out


def test_parse_kuberay_arguments() -> None:
    a = build_parser().parse_args(["connect", "--kuberay", "tpu-lab", "-n", "ml", "--context", "gke",
                                   "--no-port-forward"])
    assert (a.kuberay, a.namespace, a.context, a.no_port_forward, a.address) == (
        "tpu-lab", "ml", "gke", True, None)
    a = build_parser().parse_args(["scale", "tpu-v6e-4x4", "--slices", "3", "--cluster", "c"])
    assert (a.group, a.slices, a.cluster) == ("tpu-v6e-4x4", 3, "c")
    a = build_parser().parse_args(["up", "--manifest", "m.yaml"])
    assert a.manifest == "m.yaml" and a.name is None
    with pytest.raises(UsageError):
        build_parser().parse_args(["scale", "g"])


def test_apply_scale_delete(ip, standin: KubeStandIn, tmp_path: Path,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "tpu-lab.yaml"
    path.write_text(dump_manifest(build_raycluster("tpu-lab", ["v6e:4x4 x1"], image="i:2.60.0")))
    text, error = _run(ip, f"apply {path}")
    assert error is None and "Applied RayCluster 'tpu-lab' in namespace 'ml'" in text
    text, error = _run(ip, "scale tpu-v6e-4x4 --slices 2 --cluster tpu-lab")
    assert error is None and "set to 2 slices (maxReplicas raised from 1 to 2)" in text
    assert standin.rayclusters[(NS, "tpu-lab")]["spec"]["workerGroupSpecs"][0]["replicas"] == 2
    answers = iter(["no", "tpu-lab"])
    monkeypatch.setattr("builtins.input", lambda prompt: next(answers))
    text, error = _run(ip, "delete tpu-lab")
    assert error is None and "Not deleted." in text and (NS, "tpu-lab") in standin.rayclusters
    text, error = _run(ip, "delete tpu-lab")
    assert error is None and "Deleted RayCluster 'tpu-lab'" in text
    assert (NS, "tpu-lab") not in standin.rayclusters
    standin.add_raycluster(build_raycluster("other", ["v6e:2x2"]), NS, ready_status(1))
    text, error = _run(ip, "delete other --yes")
    assert error is None and (NS, "other") not in standin.rayclusters


@pytest.mark.parametrize(("line", "needle"), [
    ("connect --kuberay ghost", "RayCluster 'ghost' not found in namespace 'ml'"),
    ("connect --kuberay tpu-lab --context prod", "Kubeconfig context 'prod' does not exist"),
    ("connect --kuberay tpu-lab --no-port-forward", "kubectl port-forward svc/tpu-lab-head-svc 10001:10001 -n ml"),
    ("connect --kuberay tpu-lab", "kubectl port-forward svc/tpu-lab-head-svc 10001:10001 -n ml"),
    ("connect --kuberay tpu-lab --kubeconfig /nonexistent/config", "No kubeconfig found"),
    ("scale tpu-v6e-4x4 --slices 2", "which RayCluster"),
    ("scale nope --slices 2 --cluster tpu-lab", "has no worker group 'nope'"),
    ("apply /nonexistent.yaml", "Cannot read the manifest"),
    ("up --manifest /nonexistent.yaml", "Cannot read the manifest"),
])
def test_bad_input_is_one_clear_message_without_secrets(ip, standin: KubeStandIn, line: str,
                                                        needle: str) -> None:
    standin.add_raycluster(build_raycluster("tpu-lab", ["v6e:4x4"], image="i:2.60.0"), NS,
                           ready_status(4))
    text, error = _run(ip, line)
    assert error is not None, text
    assert needle in text and "What to do" in text, text
    assert "raytpu_lab/" not in text, text  # no traceback
    for secret in SECRETS:
        assert secret not in text


def test_forbidden_and_crd_missing_through_the_magic(ip, standin: KubeStandIn) -> None:
    standin.forbidden = {"get rayclusters"}
    text, error = _run(ip, "connect --kuberay tpu-lab")
    assert error is not None and "RBAC forbids it (403 Forbidden)" in text
    standin.forbidden = set()
    standin.crd_installed = False
    text, error = _run(ip, "connect --kuberay tpu-lab")
    assert error is not None and "rayclusters.ray.io) is not installed" in text
    assert all(secret not in text for secret in SECRETS)


def test_up_manifest_breaking_the_numofhosts_rule_starts_nothing(ip, standin: KubeStandIn,
                                                                 tmp_path: Path) -> None:
    m = build_raycluster("bad", ["v4:2x2x2"], image="i:2.60.0")
    m["spec"]["workerGroupSpecs"][0]["numOfHosts"] = 1
    path = tmp_path / "bad.yaml"
    path.write_text(dump_manifest(m))
    text, error = _run(ip, f"up --manifest {path}")
    assert error is not None and "the TPU webhook requires numOfHosts == 2" in text
    assert lab_module.get_lab().cluster is None
