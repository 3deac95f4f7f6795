"""A Serve replica's placement group is attributed to its app and deployment on the map."""

from raytpu_lab.state.model import _owner_name


def test_serve_replica_groups_are_named_by_app_and_deployment() -> None:
    pg = {"placement_group_id": "ab" * 14, "name": "SERVE_REPLICA::llm#LLMServer#x1y2"}
    assert _owner_name(pg, {}) == "serve: llm/LLMServer"
    assert _owner_name(pg, {"ab" * 14: "serve: llm"}) == "serve: llm"  # this session's label wins
    assert _owner_name({"placement_group_id": "cd" * 14, "name": ""}, {}) == "placement group cdcdcdcd"


def test_a_group_a_serve_replica_made_itself_is_its_app_s() -> None:
    # Ray Serve LLM's replica reserves its TPU slice itself: the group is unnamed (or "dp_0") and
    # only the GCS's creator actor ties it to the replica.
    for name in ("", "dp_0"):
        pg = {"placement_group_id": "ef" * 14, "name": name,
              "creator": "SERVE_REPLICA::llm#LLMServer#x1y2"}
        assert _owner_name(pg, {}) == "serve: llm/LLMServer"
    other = {"placement_group_id": "ef" * 14, "name": "", "creator": "TrainController"}
    assert _owner_name(other, {}) == "placement group efefefef"  # runs find theirs by this
