"""raytpu_lab: a Jupyter-first workbench for Ray on Cloud TPUs.

``%load_ext raytpu_lab`` registers the ``%raytpu`` / ``%%raytpu`` magics. The same operations are
methods of :class:`raytpu_lab.lab.Session` (``get_lab()``; ``Lab`` is its older name). Heavy
modules (Ray, IPython) load lazily so that the pure core (:mod:`raytpu_lab.tpu`,
:mod:`raytpu_lab.state.model`) imports without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from raytpu_lab.errors import (
    ConnectError,
    EmulatorError,
    InvalidTopologyError,
    KubernetesError,
    ManifestError,
    NoSliceAvailableError,
    NotConnectedError,
    RaytpuError,
    RemoteHostError,
    ReservationError,
    ServeError,
    TrainingConfigError,
    TrainingError,
)

if TYPE_CHECKING:
    from raytpu_lab.lab import Lab

__all__ = [
    "ConnectError",
    "EmulatorError",
    "InvalidTopologyError",
    "KubernetesError",
    "ManifestError",
    "NoSliceAvailableError",
    "NotConnectedError",
    "RaytpuError",
    "RemoteHostError",
    "ReservationError",
    "ServeError",
    "TrainingConfigError",
    "TrainingError",
    "get_lab",
    "load_ipython_extension",
]

__version__ = "0.1.0"


def get_lab() -> Lab:
    """The kernel's one :class:`~raytpu_lab.lab.Session`: connect, status, reserve, train."""
    from raytpu_lab.lab import get_lab as _get_lab

    return _get_lab()


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext raytpu_lab``: register the ``%raytpu`` magics."""
    from raytpu_lab.magics import RaytpuMagics

    ipython.register_magics(RaytpuMagics)
