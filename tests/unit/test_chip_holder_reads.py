"""How the state reader asks raylets who holds which chip (Ray's side is in
tests/integration/test_chip_holders.py): actors named from the GCS's record, a task's group from
its resource name, and a raylet that does not answer left alone for a while."""

from __future__ import annotations

import pytest

from raytpu_lab import _ray_private
from raytpu_lab.state import fetch


def _node(node_id: str) -> dict:
    return {"node_id": node_id, "alive": True, "ip": "10.0.0.1", "is_head": False, "labels": {},
            "resources_total": {"TPU": 4.0}, "resources_available": {"TPU": 1.0}}


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetch, "_SILENT", {})


def test_holders_get_their_actor_class_name_and_group(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = {("10.0.0.1", 1): [
        {"chips": [0], "actor_id": "a1", "job_id": "01000000", "pid": 7, "placement_group_id": ""},
        {"chips": [1, 2], "actor_id": "", "job_id": "01000000", "pid": 8,
         "placement_group_id": "pg9"}]}
    monkeypatch.setattr(_ray_private, "chip_holders_on_node",
                        lambda address, port, timeout_s: answers[(address, port)])
    monkeypatch.setattr(_ray_private, "actor_descriptions", lambda ids: {
        "a1": {"class_name": "Holder", "name": "a", "placement_group_id": "pg1"}})
    nodes = [_node("n1"), _node("n2")]
    fetch._add_chip_holders(nodes, {"n1": ("10.0.0.1", 1)})
    actor, task = nodes[0]["chip_holders"]
    assert (actor["class_name"], actor["actor_name"], actor["placement_group_id"]) == \
        ("Holder", "a", "pg1")
    assert (task["class_name"], task["placement_group_id"], task["chips"]) == ("", "pg9", [1, 2])
    assert "chip_holders" not in nodes[1]  # not asked: no chip in use


def test_a_raylet_that_does_not_answer_is_not_asked_again_for_a_while(
        monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[int] = []

    def silent(address: str, port: int, timeout_s: float) -> list:
        asked.append(port)
        raise TimeoutError("deadline exceeded")

    monkeypatch.setattr(_ray_private, "chip_holders_on_node", silent)
    monkeypatch.setattr(_ray_private, "actor_descriptions", lambda ids: {})
    nodes = [_node("n1")]
    for _ in range(3):
        fetch._add_chip_holders(nodes, {"n1": ("10.0.0.1", 5)})
    assert asked == [5] and "chip_holders" not in nodes[0]
    monkeypatch.setattr(fetch, "_SILENT", {("10.0.0.1", 5): -1e9})  # long ago: asked again
    fetch._add_chip_holders(nodes, {"n1": ("10.0.0.1", 5)})
    assert asked == [5, 5]
