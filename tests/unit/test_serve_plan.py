"""The pure placement and pre-deploy checks of a Serve deployment on a reservation."""

from __future__ import annotations

import pytest

from raytpu_lab.errors import ServeError
from raytpu_lab.serve.plan import plan_deployment

TWO_HOSTS = dict(reservation="r1", slice_names=["tpu-v4-2x2x2-0"], hosts_per_slice=2,
                 chips_per_host=4, pod_type="v4-16", app="echo", route="/echo")


def test_a_replica_takes_one_bundle_per_host_pinned_to_its_slice() -> None:
    plan = plan_deployment(**TWO_HOSTS)
    opts = plan.deployment_options()
    assert opts["placement_group_bundles"] == [{"TPU": 4.0}, {"TPU": 4.0}]
    assert opts["placement_group_bundle_label_selector"] == \
        [{"ray.io/tpu-slice-name": "tpu-v4-2x2x2-0"}] * 2
    assert opts["ray_actor_options"] == {"num_cpus": 0, "resources": {"TPU": 4.0}}
    assert opts["num_replicas"] == 1 and plan.chips_per_replica == 8


def test_several_single_host_replicas_are_pinned_to_the_reserved_slices_only() -> None:
    plan = plan_deployment(reservation="r", slice_names=["a", "b", "c"], hosts_per_slice=1,
                           chips_per_host=4, pod_type="v4-8", app="x", route="/x", replicas=2)
    assert plan.label_selector() == [{"ray.io/tpu-slice-name": "in(a,b)"}]


@pytest.mark.parametrize(("kwargs", "words"), [
    (dict(replicas=2), ["2 replicas need 2 slices", "holds 1 v4-16 slice", "8 chips each"]),
    (dict(options={"ray_actor_options": {"resources": {"TPU": 8}}}),
     ["asks for 8 TPU chips on one host", "a host has 4"]),
    (dict(options={"placement_group_bundles": [{"TPU": 4}] * 3}),
     ["ask for 12 TPU chips (3 bundle(s))", "a slice has 8"]),
    (dict(init_kwargs={"config": {"tensor_parallel_size": 4}}),
     ["tensor_parallel_size=4 (in the __init__ arguments)", "8 chips each",
      "tensor_parallel_size=8"]),
    (dict(options={"user_config": {"tensor_parallel_size": 16}}), ["(in user_config)"]),
    (dict(app="bad name"), ["not an application name"]),
    (dict(route="echo"), ["not a route prefix"]),
])
def test_refusals_give_the_numbers(kwargs: dict, words: list[str]) -> None:
    with pytest.raises(ServeError) as info:
        plan_deployment(**{**TWO_HOSTS, **kwargs})
    for word in words:
        assert word in str(info.value)


def test_several_replicas_of_multi_host_slices_are_refused_with_the_reason() -> None:
    with pytest.raises(ServeError, match="straddle two slices"):
        plan_deployment(**{**TWO_HOSTS, "slice_names": ["s0", "s1"], "replicas": 2})


def test_a_matching_tensor_parallel_size_passes() -> None:
    plan_deployment(**TWO_HOSTS, init_kwargs={"tensor_parallel_size": 8})
