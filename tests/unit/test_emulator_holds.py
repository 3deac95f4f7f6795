"""``EmulatedCluster.holds``: whether a running cluster already has the slices an ``up`` asks for
(what lets ``Lab.up`` join it instead of refusing)."""

from __future__ import annotations

import pytest

from raytpu_lab.cluster.emulator import EmulatedCluster
from raytpu_lab.errors import InvalidTopologyError


def _cluster(specs: list[tuple[str, int]]) -> EmulatedCluster:
    return EmulatedCluster(name="raytpu", address="127.0.0.1:1", dashboard_url="http://x",
                           specs=specs, head_pid=1)


def test_a_cluster_holds_what_it_was_started_with_and_less() -> None:
    c = _cluster([("v6e:4x4", 2), ("v4:2x2x2", 3), ("v5litepod:2x2", 1)])
    assert c.holds([("v6e:4x4", 2)]) and c.holds([("v6e:4x4", 1)])
    assert c.holds([("v4:2x2x2", 3), ("v6e:4x4", 2)])
    assert c.holds([("v5e:2x2", 1)])  # the same generation by its other name
    assert c.holds([("V4:2X2X2", 1)])  # specs are normalized as parse_spec does


def test_a_cluster_does_not_hold_more_slices_or_other_shapes() -> None:
    c = _cluster([("v6e:4x4", 2), ("v4:2x2x2", 1)])
    assert not c.holds([("v6e:4x4", 3)])
    assert not c.holds([("v4:2x2x2", 1), ("v4:2x2x2", 1)])  # asked twice: two slices
    assert not c.holds([("v6e:2x2", 1)])
    assert not c.holds([("v5p:2x2x2", 1)])


def test_an_invalid_spec_is_the_usual_topology_error() -> None:
    with pytest.raises(InvalidTopologyError):
        _cluster([("v6e:4x4", 1)]).holds([("v6e:4x5", 1)])
