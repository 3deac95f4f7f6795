"""RayCluster manifests: build, parse, CRD-schema validation, the TPU webhook's numOfHosts rule."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from raytpu_lab.errors import InvalidTopologyError, ManifestError
from raytpu_lab.kuberay import (
    build_raycluster,
    check_manifest,
    dump_manifest,
    group_specs_of,
    hosts_for_topology,
    load_manifest,
    parse_group_spec,
    parse_quantity,
    parse_raycluster,
    schema_problems,
    validate_manifest,
)
from raytpu_lab.kuberay.schema import raycluster_schema

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("RAYTPU_SHARED", "/work/shared")) / "kuberay"
# KubeRay's samples, copied with the tests (provenance in the folder's README).
SAMPLES = sorted((Path(__file__).parents[1] / "fixtures" / "kuberay_samples").glob("*.yaml"))
TPU_SAMPLES = [p for p in SAMPLES if "tpu" in p.name]


# --- generation x topology table: (spec, pod type, chips/host, numOfHosts, accelerator) ---------

BUILD_TABLE = [
    ("v4:2x2x1", "v4-8", 4, 1, "tpu-v4-podslice"),
    ("v4:2x2x2", "v4-16", 4, 2, "tpu-v4-podslice"),
    ("v4:4x4x4", "v4-128", 4, 16, "tpu-v4-podslice"),
    ("v5e:1x1", "v5litepod-1", 1, 1, "tpu-v5-lite-podslice"),
    ("v5e:2x4", "v5litepod-8", 8, 1, "tpu-v5-lite-podslice"),
    ("v5e:4x4", "v5litepod-16", 4, 4, "tpu-v5-lite-podslice"),
    ("v5p:2x2x1", "v5p-8", 4, 1, "tpu-v5p-slice"),
    ("v5p:2x2x4", "v5p-32", 4, 4, "tpu-v5p-slice"),
    ("v6e:2x2", "v6e-4", 4, 1, "tpu-v6e-slice"),
    ("v6e:4x4", "v6e-16", 4, 4, "tpu-v6e-slice"),
    ("v6e:8x16", "v6e-128", 4, 32, "tpu-v6e-slice"),
    ("v6e:16x16", "v6e-256", 4, 64, "tpu-v6e-slice"),
    ("v7x:2x2x1", "v7x-8", 4, 1, "tpu7x"),
    ("v7x:2x2x2", "v7x-16", 4, 2, "tpu7x"),
    ("tpu7x:4x4x4", "v7x-128", 4, 16, "tpu7x"),
]


@pytest.mark.parametrize(("spec", "pod_type", "chips", "hosts", "accelerator"), BUILD_TABLE)
def test_build_every_generation(spec: str, pod_type: str, chips: int, hosts: int,
                                accelerator: str) -> None:
    m = build_raycluster("lab", [f"{spec} x3"], image="rayproject/ray:2.60.0-py311")
    assert schema_problems(m) == []
    g = m["spec"]["workerGroupSpecs"][0]
    assert g["numOfHosts"] == hosts and g["replicas"] == 3
    worker = g["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"]["google.com/tpu"] == str(chips)
    assert worker["resources"]["requests"]["google.com/tpu"] == str(chips)
    assert g["template"]["spec"]["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": accelerator,
        "cloud.google.com/gke-tpu-topology": spec.split(":")[1]}
    plan = parse_raycluster(m)
    (group,) = plan.tpu_groups
    assert (group.shape.pod_type, group.num_of_hosts, group.replicas) == (pod_type, hosts, 3)
    assert plan.expected_hosts == {f"{g['groupName']}-{r}": hosts for r in range(3)}
    assert plan.service_name == "lab-head-svc"
    assert plan.head.ports["client"] == 10001


def test_build_several_groups_and_options() -> None:
    m = build_raycluster("multi", ["v6e:4x4 x2", ("v4:2x2x2", 1)], namespace="ml", cpu="24",
                         memory="200G", env={"JAX_PLATFORMS": "tpu,cpu"}, image="img:2.60.0-py311")
    assert m["metadata"] == {"name": "multi", "namespace": "ml"}
    assert m["spec"]["rayVersion"] == "2.60.0"
    plan = check_manifest(m)
    assert [g.name for g in plan.tpu_groups] == ["tpu-v6e-4x4", "tpu-v4-2x2x2"]
    assert plan.tpu_groups[0].cpu == 24 and plan.tpu_groups[0].memory_bytes == 200 * 10**9
    assert plan.tpu_groups[0].env == ({"name": "JAX_PLATFORMS", "value": "tpu,cpu"},)
    assert [s.name for s in plan.expected_slices()] == ["tpu-v6e-4x4-0", "tpu-v6e-4x4-1",
                                                         "tpu-v4-2x2x2-0"]


@pytest.mark.parametrize("text", ["v6e:4x4 x", "v6e 4x4", "v6e:4x4 x0", "v9:2x2", "v6e:3x3"])
def test_bad_group_specs(text: str) -> None:
    with pytest.raises(InvalidTopologyError):
        parse_group_spec(text)


def test_duplicate_groups_refused() -> None:
    with pytest.raises(InvalidTopologyError, match="Two worker groups"):
        build_raycluster("x", ["v6e:4x4", "v6e:4x4 x2"])


def test_default_image_matches_this_ray_and_python() -> None:
    from importlib import metadata

    m = build_raycluster("x", ["v6e:2x2"])
    image = m["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"rayproject/ray:{metadata.version('ray')}-py{sys.version_info[0]}{sys.version_info[1]}"


@pytest.mark.parametrize(("topology", "chips", "hosts"), [
    ("2x2x2", 4, 2), ("2x2", 4, 1), ("4x4", 4, 4), ("16x16", 4, 64), ("2x4", 8, 1), ("2x4", 4, 2),
    ("1x1", 1, 1)])
def test_webhook_host_rule_examples(topology: str, chips: int, hosts: int) -> None:
    # The examples of shared/kuberay/README.md (b).
    assert hosts_for_topology(topology, chips) == hosts


# --- the KubeRay samples ----------------------------------------------------------------------

def test_samples_are_present() -> None:
    assert len(TPU_SAMPLES) == 10


@pytest.mark.parametrize("path", SAMPLES, ids=[p.name for p in SAMPLES])
def test_kuberay_samples_validate(path: Path) -> None:
    m = load_manifest(path)
    assert schema_problems(m) == []
    check_manifest(m, source=path.name)


@pytest.mark.parametrize("path", TPU_SAMPLES, ids=[p.name for p in TPU_SAMPLES])
def test_kuberay_tpu_samples_round_trip(path: Path) -> None:
    plan = parse_raycluster(load_manifest(path))
    assert plan.tpu_groups
    rebuilt = build_raycluster(plan.name, group_specs_of(plan.tpu_groups), image="img:2.52.0")
    assert schema_problems(rebuilt) == []
    again = parse_raycluster(rebuilt)
    assert [g.summary() for g in again.tpu_groups] == [g.summary() for g in plan.tpu_groups]
    # and through YAML text, as a file would carry it
    reloaded = parse_raycluster(__import__("yaml").safe_load(dump_manifest(rebuilt)))
    assert [g.summary() for g in reloaded.tpu_groups] == [g.summary() for g in plan.tpu_groups]


def test_sample_facts() -> None:
    by_name = {p.name: parse_raycluster(load_manifest(p)) for p in TPU_SAMPLES}
    v4 = by_name["ray-cluster.tpu-v4-multihost.yaml"].tpu_groups[0]
    assert (v4.shape.pod_type, v4.num_of_hosts, v4.chips_per_host) == ("v4-16", 2, 4)
    vllm = by_name["ray-service.vllm-tpu-v6e-singlehost.yaml"]
    assert vllm.kind == "RayService" and vllm.tpu_groups[0].shape.pod_type == "v6e-8"
    job = by_name["ray-job.tpu-v6e-256-multihost.yaml"].tpu_groups[0]
    assert job.num_of_hosts == 64 and job.ray_start_params == {"resources": '"{\\"TPU\\": 4}"'}


# --- bad manifests --------------------------------------------------------------------------

def _good() -> dict:
    return build_raycluster("bad", ["v6e:4x4 x2", "v4:2x2x2"], image="img:2.60.0")


def test_schema_catches_typos_and_types_with_paths() -> None:
    m = _good()
    m["spec"]["workerGroupSpecs"][0]["numOfHost"] = 4
    m["spec"]["workerGroupSpecs"][1]["replicas"] = "two"
    m["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "2 cores"
    problems = schema_problems(m)
    assert "spec.workerGroupSpecs[0]: Additional properties are not allowed ('numOfHost' was unexpected)" in problems
    assert "spec.workerGroupSpecs[1].replicas: 'two' is not of type 'integer'" in problems
    assert any(p.startswith("spec.headGroupSpec.template.spec.containers[0].resources.limits.cpu")
               for p in problems)
    with pytest.raises(ManifestError) as info:
        validate_manifest(m, source="bad.yaml")
    err = info.value
    assert err.source == "bad.yaml" and len(err.problems) == 3
    assert "bad.yaml does not match the RayCluster CRD schema" in str(err)
    assert "What to do:" in str(err)


def test_schema_defaults_required_fields_like_the_api_server() -> None:
    m = _good()
    for g in m["spec"]["workerGroupSpecs"]:
        del g["minReplicas"], g["maxReplicas"]  # required in the CRD, but defaulted
    assert schema_problems(m) == []
    del m["spec"]["headGroupSpec"]["template"]
    assert schema_problems(m) == ["spec.headGroupSpec: 'template' is a required property"]


def test_schema_wants_ray_io_v1() -> None:
    m = _good()
    m["apiVersion"] = "ray.io/v1alpha1"
    assert schema_problems(m) == ["apiVersion: 'ray.io/v1alpha1', expected 'ray.io/v1'"]


def test_numofhosts_rule() -> None:
    m = _good()
    m["spec"]["workerGroupSpecs"][0]["numOfHosts"] = 2
    assert schema_problems(m) == []  # the schema allows it; the TPU webhook does not
    with pytest.raises(ManifestError) as info:
        check_manifest(m, source="m.yaml")
    assert info.value.problems == [
        "spec.workerGroupSpecs[0].numOfHosts: 2, but v6e 4x4 with 4 chips per host has 4 host(s) "
        "(the TPU webhook requires numOfHosts == 4)"]
    assert str(info.value).splitlines()[0].startswith("m.yaml: 1 problem(s) in the TPU worker groups")


def test_tpu_group_problems_are_all_listed() -> None:
    m = _good()
    g0, g1 = m["spec"]["workerGroupSpecs"]
    del g0["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-topology"]
    g1["template"]["spec"]["containers"][0]["resources"]["requests"]["google.com/tpu"] = "8"
    g1["template"]["spec"]["nodeSelector"]["cloud.google.com/gke-tpu-topology"] = "3x3x3"
    with pytest.raises(ManifestError) as info:
        parse_raycluster(m)
    problems = info.value.problems
    assert any("no cloud.google.com/gke-tpu-topology" in p for p in problems)
    assert any("requests (8) differ from limits (4)" in p for p in problems)
    assert any("3x3x3" in p and "not a valid topology" in p for p in problems)


def test_not_a_raycluster() -> None:
    with pytest.raises(ManifestError, match="kind is 'Deployment'"):
        check_manifest({"apiVersion": "apps/v1", "kind": "Deployment"})
    with pytest.raises(ManifestError, match="no spec.rayClusterSpec"):
        parse_raycluster({"apiVersion": "ray.io/v1", "kind": "RayJob", "spec": {}})


def test_rayjob_paths_point_into_the_embedded_spec() -> None:
    job = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "j"},
           "spec": {"entrypoint": "python x.py", "rayClusterSpec": copy.deepcopy(_good()["spec"])}}
    assert schema_problems(job) == []
    job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = -1.5
    assert schema_problems(job) == [
        "spec.rayClusterSpec.workerGroupSpecs[0].replicas: -1.5 is not of type 'integer'"]


def test_load_manifest_errors(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="Cannot read the manifest"):
        load_manifest(tmp_path / "none.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: RayCluster\n  spec: [\n")
    with pytest.raises(ManifestError, match="not valid YAML at line"):
        load_manifest(bad)
    other = tmp_path / "other.yaml"
    other.write_text("kind: ConfigMap\n---\nkind: Service\n")
    with pytest.raises(ManifestError, match="holds no RayCluster"):
        load_manifest(other)
    several = tmp_path / "several.yaml"
    several.write_text("kind: ConfigMap\n---\n" + dump_manifest(_good()))
    assert load_manifest(several)["metadata"]["name"] == "bad"


# --- quantities and the shipped schema -------------------------------------------------------

@pytest.mark.parametrize("q", ["1", "500m", "40G", "200Gi", "1.5", "0.5Ki", "1e3", "2E", "100n", 4, 2.5])
def test_quantities_agree_with_the_kubernetes_client(q: object) -> None:
    from kubernetes.utils import parse_quantity as k8s

    assert parse_quantity(q) == k8s(q)


@pytest.mark.parametrize("q", ["", "ten", "1.2.3", "5 Gi", True])
def test_bad_quantities(q: object) -> None:
    with pytest.raises(ValueError):
        parse_quantity(q)


def test_shipped_schema_is_the_crd_v1_schema() -> None:
    crd = SHARED / "raycluster-crd.yaml"
    if not crd.is_file():
        pytest.skip(f"{crd} (the reference copy) is not on this machine")
    import yaml

    doc = yaml.load(crd.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (v1,) = [v for v in doc["spec"]["versions"] if v["name"] == "v1"]
    assert json.loads(json.dumps(v1["schema"]["openAPIV3Schema"])) == raycluster_schema()


def test_manifest_modules_import_no_ray_ipython_or_kubernetes_client() -> None:
    code = ("import sys, raytpu_lab.kuberay, raytpu_lab.kuberay.pods, raytpu_lab.kuberay.status; "
            "print(sorted(m for m in ('ray', 'IPython', 'kubernetes', 'urllib3') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=REPO)
    assert out.stdout.strip() == "[]"
