"""Options the two front ends share: ``up`` and ``down`` mean the same in a cell (``%raytpu up``,
:mod:`raytpu_lab.magics.parser`) and a shell (``raytpu up``, :mod:`raytpu_lab.cli`).

Imports nothing heavy: ``raytpu --help`` must stay quick.
"""

from __future__ import annotations

import argparse
import os

from raytpu_lab._argtypes import positive_seconds

__all__ = ["DEFAULT_TPU", "add_down_options", "add_up_options"]

#: The slice shape ``up`` starts when no --tpu (nor --manifest) is given.
DEFAULT_TPU = "v6e:4x4"


def add_up_options(parser: argparse.ArgumentParser) -> None:
    """The options of ``up``, the same in a cell (``%raytpu up``) and a shell (``raytpu up``):
    ``--tpu`` (repeatable: one shape each, ``args.tpu`` a list or ``None`` for
    :data:`DEFAULT_TPU`), ``--slices`` of each shape, ``--name``, ``--manifest`` (instead of
    ``--tpu``) and ``--timeout`` in seconds (default 180, or ``$RAYTPU_UP_TIMEOUT_S``)."""
    shapes = parser.add_mutually_exclusive_group()
    shapes.add_argument("--tpu", action="append", metavar="V:TOPO",
                        help="slice shape, e.g. v6e:4x4, v5e:2x2, v4:2x2x2, v7x:2x2x1; repeat for "
                             f"several shapes (default {DEFAULT_TPU})")
    shapes.add_argument("--manifest", metavar="FILE",
                        help="emulate this RayCluster manifest's TPU worker groups (YAML/JSON) "
                             "instead of --tpu/--slices")
    parser.add_argument("--slices", type=int, default=2, help="slices of each shape (default 2)")
    parser.add_argument("--name", default=None,
                        help="cluster name (default raytpu, or the manifest's "
                             "metadata.name)")
    parser.add_argument("--timeout", type=positive_seconds,
                        default=float(os.environ.get("RAYTPU_UP_TIMEOUT_S") or 180.0),
                        help="seconds to wait for every node to start (default 180, or "
                             "$RAYTPU_UP_TIMEOUT_S)")


def add_down_options(parser: argparse.ArgumentParser) -> None:
    """The options of ``down`` in a cell and a shell: ``--name`` stops the emulated cluster of
    that name, whoever started it."""
    parser.add_argument("--name", default=None,
                        help="stop the emulated cluster of this name, whoever started it")
