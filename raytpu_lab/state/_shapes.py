"""Cached shape look-ups for the state model; pure.

A pod has thousands of hosts of a handful of shapes: validating each host's shape on every refresh
dominated :func:`raytpu_lab.state.model.build_snapshot`, so the answers (frozen shapes, or the
error) are cached here and shared.
"""

from __future__ import annotations

import functools
import math

from raytpu_lab.errors import InvalidTopologyError
from raytpu_lab.tpu.generations import normalize_version
from raytpu_lab.tpu.topology import SliceShape, split_pod_type

__all__ = ["pod_key", "cached_shape", "table_shape", "labelled_shape", "whole_chips"]


@functools.lru_cache(maxsize=4096)
def pod_key(pod_type: str) -> tuple[str, int] | str:
    """``(version, cores)`` of a pod type (``"tpu7x-8"`` and ``"v7x-8"`` alike), else the text."""
    try:
        return split_pod_type(pod_type)
    except InvalidTopologyError:
        return pod_type


@functools.lru_cache(maxsize=4096)
def cached_shape(version: str, topology: str, chips_per_host: int = 0
                 ) -> SliceShape | InvalidTopologyError:
    """:class:`SliceShape` (frozen, so shared) or the error it raised."""
    try:
        return SliceShape(version, topology, chips_per_host)
    except InvalidTopologyError as err:
        return err


def table_shape(version: str, topology: str, chips_per_host: int = 0) -> SliceShape:
    """The cached :class:`SliceShape`.

    Raises:
        InvalidTopologyError: No such shape (a fresh error each time, not the cached one).
    """
    shape = cached_shape(version, topology, chips_per_host)
    if isinstance(shape, InvalidTopologyError):  # rare: raise a fresh error, not the cached one
        return SliceShape(version, topology, chips_per_host)
    return shape


@functools.lru_cache(maxsize=4096)
def labelled_shape(pod: str | None, accel: str | None, topology: str
                   ) -> SliceShape | InvalidTopologyError:
    """The shape a node's pod type (else accelerator type) and topology labels name, or why not."""
    try:
        version = split_pod_type(pod)[0] if pod else normalize_version(accel or "")
    except InvalidTopologyError as err:
        return err
    return cached_shape(version, topology)


def whole_chips(amount: float | str | None) -> int:
    """Whole chips in a resource amount (a partly used chip is not free)."""
    try:
        return max(0, math.floor(float(amount or 0) + 1e-9))
    except (TypeError, ValueError):
        return 0
