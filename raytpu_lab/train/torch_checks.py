"""Checks a PyTorch/XLA run must pass before it takes any resources. Pure: no Ray, no torch import.

Each check raises :class:`~raytpu_lab.errors.TrainingConfigError` (what, why, what to do) or
returns what the launcher needs:

- :func:`installed_versions` / :func:`check_torch_versions`: ``torch`` and ``torch_xla`` present
  and built for each other (read from package metadata, so nothing heavy is imported).
- :func:`workers_per_run`: one Ray Train worker per ``chips_per_worker`` chips, never across hosts.

The training function's signature is checked by the rule every run uses,
:func:`raytpu_lab.train.worker_tap.accepts_config`.
"""

from __future__ import annotations

import re
from importlib import metadata

from raytpu_lab.advice import opt
from raytpu_lab.errors import TrainingConfigError
from raytpu_lab.tpu.topology import SliceShape

__all__ = [
    "BACKENDS", "TORCH_EXTRA", "check_backend", "check_torch_versions", "installed_versions",
    "workers_per_run",
]

TORCH_EXTRA = "pip install 'raytpu_lab[torch]'"
BACKENDS = ("xla", "tpu_dist", "gloo")
"""Process-group backends a run may ask for: torch_xla's ``xla``, torch_tpu's ``tpu_dist``
(what Ray 2.60's ``TorchTrainer(use_tpu=True)`` picks by default), and ``gloo`` (CPU)."""


def installed_versions() -> tuple[str | None, str | None]:
    """``(torch version, torch_xla version)`` from the installed distributions; ``None`` if absent."""
    found: list[str | None] = []
    for dist in ("torch", "torch_xla"):
        try:
            found.append(metadata.version(dist))
        except metadata.PackageNotFoundError:
            found.append(None)
    return found[0], found[1]


def _release(version: str) -> tuple[int, ...]:
    """``"2.9.0+cu128"`` -> ``(2, 9, 0)``: the public release, without local or pre-release tags."""
    match = re.match(r"(\d+(?:\.\d+)*)", version)
    return tuple(int(p) for p in match.group(1).split(".")) if match else ()


def check_torch_versions(torch_version: str | None, torch_xla_version: str | None) -> None:
    """Refuse a run unless torch and torch_xla are installed with matching releases.

    torch_xla's C++ extension (``_XLAC``) is built against one torch release; the PyPI wheel
    ``torch_xla==2.9.0`` pins ``torch==2.9.0``. With another torch it fails to load (undefined
    symbols) inside every worker, after the slice was reserved, so we compare major.minor here.

    Raises:
        TrainingConfigError: One of them is missing (the message names the extra), or their
            major.minor releases differ.
    """
    missing = [name for name, v in (("torch", torch_version), ("torch_xla", torch_xla_version))
               if v is None]
    if missing:
        raise TrainingConfigError(
            f"PyTorch/XLA runs need {' and '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} "
            f"not installed: {TORCH_EXTRA}")
    assert torch_version is not None and torch_xla_version is not None
    if _release(torch_version)[:2] != _release(torch_xla_version)[:2]:
        want = ".".join(map(str, _release(torch_xla_version)))
        raise TrainingConfigError(
            f"torch {torch_version} does not match torch_xla {torch_xla_version}.",
            why=f"torch_xla's compiled extension is built against one torch release (torch_xla "
                f"{torch_xla_version} wants torch=={want}); with another it fails to load in "
                "every worker.",
            fix=f"Install the pair together: pip install 'torch=={want}' 'torch_xla=={want}' "
                f"(or {TORCH_EXTRA}).")


def check_backend(backend: str | None) -> None:
    """Refuse a process-group backend we cannot set up.

    Raises:
        TrainingConfigError: ``backend`` is not ``None`` or one of :data:`BACKENDS`.
    """
    if backend is not None and backend not in BACKENDS:
        raise TrainingConfigError(
            (opt("backend", backend), " is not supported."),
            why="A TPU run's process group is torch_xla's xla, torch_tpu's tpu_dist or gloo.",
            fix=f"Use one of {', '.join(BACKENDS)}, or leave it out (xla on TPUs, gloo on the "
                "emulator).")


def workers_per_run(shape: SliceShape, num_slices: int, chips_per_worker: int = 1) -> int:
    """Ray Train workers for device-centric training: chips x slices / ``chips_per_worker``.

    A worker's chips must sit on one host (Ray places each worker's ``{"TPU": n}`` bundle on one
    node), so ``chips_per_worker`` must divide the chips of a host, and hence of the slice.

    Raises:
        TrainingConfigError: ``chips_per_worker`` < 1, or it does not divide the chips per host.
    """
    if chips_per_worker < 1 or shape.chips_per_host % chips_per_worker:
        raise TrainingConfigError(
            f"{shape.pod_type} ({shape.topology}) has {shape.num_chips} chips, "
            f"{shape.chips_per_host} per host; {chips_per_worker} TPU chip(s) per worker does not "
            f"divide {shape.chips_per_host}.",
            why="Each worker's TPU request must fit on one host, and every chip must get a worker.",
            fix=f"Ask for a divisor of {shape.chips_per_host} chips per worker (1 is one worker "
                "per chip, the PyTorch/XLA default).")
    return shape.num_chips * num_slices // chips_per_worker
