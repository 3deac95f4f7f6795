"""A Serve replica's placement group is attributed to its app and deployment on the map."""

from raytpu_lab.state.model import _owner_name


def test_serve_replica_groups_are_named_by_app_and_deployment() -> None:
    pg = {"placement_group_id": "ab" * 14, "name": "SERVE_REPLICA::llm#LLMServer#x1y2"}
    assert _owner_name(pg, {}) == "serve: llm/LLMServer"
    assert _owner_name(pg, {"ab" * 14: "serve: llm"}) == "serve: llm"  # this session's label wins
    assert _owner_name({"placement_group_id": "cd" * 14, "name": ""}, {}) == "placement group cdcdcdcd"
