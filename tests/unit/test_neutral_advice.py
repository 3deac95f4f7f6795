"""Core messages name commands and options neutrally (raytpu_lab/advice.py): no ``%raytpu`` and
no ``--flag`` in their text; the front ends (magics, cli.py) spell them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import raytpu_lab

PACKAGE = Path(raytpu_lab.__file__).resolve().parent
CORE = ["reservations", "session", "train", "kuberay", "cluster", "lab.py", "errors.py", "_checks.py"]
FRONT_SYNTAX = re.compile(r"%raytpu|(?<![\w-])--[a-z]")

# Real shell command lines (kubectl, ray start, xprof) and XLA flags: not advice.
PROCESS_LINES = {
    ("kuberay/portforward.py", " --context "),
    ("kuberay/emulate.py", "ray start --resources takes a JSON object of resource amounts."),
    ("cluster/gke_env.py", "--xla_force_host_platform_device_count="),
    ("train/profile_analysis.py", "xprof server --logdir "),
    ("train/profile_analysis.py", " --port 8791"),
    ("kuberay/api_errors.py", "Get fresh credentials: gcloud container clusters get-credentials "
                              "CLUSTER --location LOCATION."),
    ("kuberay/client.py", "Get credentials for the GKE cluster (gcloud container clusters "
                          "get-credentials CLUSTER --location LOCATION), or pass "),
    ("kuberay/client.py", "Check it with kubectl config view --minify, or get fresh credentials."),
}
# A string that is one command-line token (``--temp-dir=``, ``--head``) is an argument of a
# process the emulator starts (``ray start``), not advice to a user.
PROCESS_ARGUMENT = re.compile(r"--[a-z][a-z-]*(=\S*)?")


def _message_strings(path: Path) -> list[str]:
    """String constants in code (f-string parts included), docstrings aside."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]


def _core_files() -> list[Path]:
    files: list[Path] = []
    for entry in CORE:
        p = PACKAGE / entry
        files.extend(sorted(p.rglob("*.py")) if p.is_dir() else [p])
    return files


def test_no_core_message_is_spelled_for_one_front_end() -> None:
    found: dict[str, list[str]] = {}
    for path in _core_files():
        rel = path.relative_to(PACKAGE).as_posix()
        bad = [s for s in _message_strings(path)
               if FRONT_SYNTAX.search(s) and (rel, s) not in PROCESS_LINES
               and not PROCESS_ARGUMENT.fullmatch(s)]
        if bad:
            found[rel] = bad
    assert found == {}, f"spell these with raytpu_lab.advice (cmd / opt): {found}"


def test_the_scan_finds_front_end_syntax(tmp_path: Path) -> None:
    sample = tmp_path / "m.py"
    sample.write_text('"""Doc: %raytpu up is fine here."""\n'
                      'x = f"Pass --slices {n}."\ny = "Check %raytpu status."\nz = "a-b --> c"\n')
    assert sorted(s for s in _message_strings(sample) if FRONT_SYNTAX.search(s)) == [
        "Check %raytpu status.", "Pass --slices "]
