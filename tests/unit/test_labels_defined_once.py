"""Ray/GKE/KubeRay label names and the reservation prefix are spelled once, in raytpu_lab/tpu/labels.py."""

from __future__ import annotations

import ast
from pathlib import Path

from raytpu_lab.tpu import labels

PACKAGE = Path(labels.__file__).resolve().parents[1]
NAMES = {getattr(labels, n): n for n in labels.__all__ if isinstance(getattr(labels, n), str)}

def _literals(path: Path) -> set[str]:
    """Label names used as string constants in code (docstrings and f-string text aside)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
    return {n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
            and n.value in NAMES}


def test_each_name_is_spelled_only_in_labels_module() -> None:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "tpu/labels.py":
            continue
        names = _literals(path)
        if names:
            found[rel] = names
    assert found == {}, f"spell these through raytpu_lab.tpu.labels: {found}"


def test_labels_module_defines_each_value_once() -> None:
    values = [getattr(labels, n) for n in labels.__all__ if isinstance(getattr(labels, n), str)]
    assert len(values) == len(set(values))
