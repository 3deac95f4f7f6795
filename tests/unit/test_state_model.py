"""The pure state model on recorded raw states and hand-made edge cases."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from raytpu_lab.state import ClusterSnapshot, build_snapshot

FIXTURES = Path(__file__).parent / "fixtures"
S0, S1 = "tpu-v6e-4x4-0", "tpu-v6e-4x4-1"
RESERVATION_PG = "52c4c4377bbe3c5c5a23ccbff8de01000000"
HEAD_LOCK_PG = "57ed7bee321c42b5bd192a150d1701000000"


def _load(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"raw_v6e_4x4_x2_{name}.json").read_text())


def _node(slice_name: str | None, worker: int | str | None, *, pod: str = "v6e-16",
          topology: str = "4x4", tpu: float = 4, avail: float | None = None,
          alive: bool = True, node_id: str | None = None, head: bool | None = None,
          labels: dict[str, str] | None = None) -> dict[str, Any]:
    """One raw node as fetch_raw_state returns it; ``avail=None`` means all chips free."""
    node_id = node_id or f"{slice_name}-w{worker}".ljust(56, "0")
    lab = {"ray.io/node-id": node_id}
    if slice_name is not None:
        lab.update({"ray.io/tpu-slice-name": slice_name, "ray.io/tpu-topology": topology,
                    "ray.io/tpu-pod-type": pod, "ray.io/accelerator-type": "TPU-V6E"})
    if worker is not None:
        lab["ray.io/tpu-worker-id"] = str(worker)
    lab.update(labels or {})
    total: dict[str, float] = {"CPU": 4.0, "TPU": float(tpu)}
    if slice_name:
        total[slice_name] = 1.0
    if head if head is not None else worker in (0, "0"):
        total[f"TPU-{pod}-head"] = 1.0
    available = dict(total)
    available["TPU"] = float(tpu if avail is None else avail)
    if not available["TPU"]:
        del available["TPU"]  # as Ray: exhausted resources are omitted
    return {"node_id": node_id, "alive": alive, "ip": "10.0.0.7", "is_head": False,
            "labels": lab, "resources_total": total,
            "resources_available": available if alive else {}}


def _slice(name: str = S0, workers: range = range(4), **kw: Any) -> list[dict[str, Any]]:
    return [_node(name, w, **kw) for w in workers]


def _raw(nodes: list[dict[str, Any]], groups: list[dict[str, Any]] | None = None
         ) -> dict[str, Any]:
    cpu_head = {"node_id": "f" * 56, "alive": True, "ip": "10.0.0.1", "is_head": True,
                "labels": {}, "resources_total": {"CPU": 2.0},
                "resources_available": {"CPU": 2.0}}
    return {"fetched_at": 1.0, "nodes": [cpu_head, *nodes], "placement_groups": groups or []}


def _pg(pg_id: str, name: str, bundles: list[tuple[str | None, dict[str, float]]]
        ) -> dict[str, Any]:
    return {"placement_group_id": pg_id, "name": name, "state": "CREATED",
            "bundles": [{"index": i, "node_id": n, "resources": r}
                        for i, (n, r) in enumerate(bundles)]}


def _by_worker(snap: ClusterSnapshot, name: str = S0) -> dict[int, Any]:
    return {h.worker_id: h for h in snap.slice(name).hosts}


# --- recorded fixtures -----------------------------------------------------------------------

def test_idle_fixture() -> None:
    snap = build_snapshot(_load("idle"))
    assert [s.name for s in snap.slices] == [S0, S1]
    for s in snap.slices:
        assert (s.pod_type, s.version, s.topology) == ("v6e-16", "v6e", "4x4")
        assert (s.health, s.reasons, s.owners, s.state) == ("intact", [], [], "free")
        assert (s.hosts_alive, s.hosts_expected, s.chips_total, s.chips_free) == (4, 4, 16, 16)
        assert [h.worker_id for h in s.hosts] == [0, 1, 2, 3]
        assert all(h.chip_states() == ["free"] * 4 for h in s.hosts)
        assert not s.head_locked
    assert [s.name for s in snap.idle_slices("v6e-16")] == [S0, S1]
    assert snap.idle_slices("v6e-8") == [] and snap.slices_of("v4-16") == []
    assert (snap.total_chips, snap.free_chips) == (32, 32)
    assert snap.head_node_id is not None and snap.head_node_id.startswith("aa2e30f5")
    assert [(n.is_head, n.reason) for n in snap.other_nodes] == [(True, "no TPU labels")]
    assert json.loads(json.dumps(snap.to_dict()))["slices"][0]["state"] == "free"


def test_one_reserved_fixture() -> None:
    snap = build_snapshot(_load("one_reserved"))
    s0, s1 = snap.slice(S0), snap.slice(S1)
    assert (s0.state, s0.health, s0.owners, s0.head_locked) == ("reserved", "intact", ["a"], True)
    assert all((h.state, h.owner, h.chips_free, h.chips_reserved, h.chips_busy)
               == ("reserved", "a", 0, 4, 0) for h in s0.hosts)
    assert s0.hosts[0].chip_states() == ["reserved"] * 4
    assert (s1.state, s1.owners) == ("free", [])
    assert [s.name for s in snap.idle_slices("v6e-16")] == [S1]
    assert (snap.total_chips, snap.free_chips) == (32, 16)
    assert snap.pending_owners == []
    data = snap.to_dict()
    assert data["slices"][0]["hosts"][0]["owner"] == "a"
    assert data["slices"][0]["shape"] == {"version": "v6e", "topology": "4x4",
                                          "chips_per_host": 4}


def test_registry_names_and_foreign_groups() -> None:
    raw = _load("one_reserved")
    assert build_snapshot(raw, reservations={RESERVATION_PG: "mine"}).slice(S0).owners == ["mine"]
    raw = copy.deepcopy(raw)
    for pg in raw["placement_groups"]:
        pg["name"] = ""
    s0 = build_snapshot(raw).slice(S0)
    assert s0.owners == [f"placement group {RESERVATION_PG[:8]}"]
    assert s0.state == "reserved"


def test_head_lock_alone_is_not_idle() -> None:
    nodes = _slice()
    nodes[0]["resources_available"].pop("TPU-v6e-16-head")
    lock = _pg(HEAD_LOCK_PG, "", [(nodes[0]["node_id"], {"TPU-v6e-16-head": 1.0})])
    snap = build_snapshot(_raw(nodes, [lock]))
    s = snap.slice(S0)
    assert (s.head_locked, s.owners, s.chips_free, s.state) == (True, [], 16, "partial")
    assert snap.idle_slices() == []


def test_snapshot_is_frozen_and_lookup_fails_clearly() -> None:
    snap = build_snapshot(_load("idle"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.slices[0].health = "degraded"  # type: ignore[misc]
    with pytest.raises(KeyError, match="tpu-v6e-4x4-0"):
        snap.slice("nope")


# --- chips ----------------------------------------------------------------------------------

def test_exhausted_tpu_key_means_zero_free() -> None:
    snap = build_snapshot(_raw(_slice(avail=0)))
    s = snap.slice(S0)
    assert "TPU" not in _slice(avail=0)[0]["resources_available"]
    assert (s.state, s.chips_free, s.chips_busy, s.owners) == ("busy", 0, 16, [])
    assert all(h.state == "busy" and h.chip_states() == ["busy"] * 4 for h in s.hosts)


def test_reserved_busy_and_free_on_one_host() -> None:
    nodes = _slice()
    nodes[1]["resources_available"]["TPU"] = 1.0  # 2 held by the bundle, 1 busy outside it
    pg = _pg("ab" * 18, "raytpu:r", [(nodes[1]["node_id"], {"TPU": 2.0})])
    s = build_snapshot(_raw(nodes, [pg])).slice(S0)
    host = s.hosts[1]
    assert (host.state, host.owner, host.chips_reserved, host.chips_busy, host.chips_free) == (
        "reserved", "r", 2, 1, 1)
    assert host.chip_states() == ["reserved", "reserved", "busy", "free"]
    assert (s.state, s.owners, s.chips_free) == ("partial", ["r"], 13)


def test_fractional_tpu_in_use_is_not_free() -> None:
    nodes = _slice()
    nodes[2]["resources_available"]["TPU"] = 3.5
    host = build_snapshot(_raw(nodes)).slice(S0).hosts[2]
    assert (host.chips_free, host.chips_busy, host.state) == (3, 1, "busy")


def test_unplaced_bundle_is_pending() -> None:
    nodes = _slice()
    pg = _pg("cd" * 18, "raytpu:b", [(nodes[0]["node_id"], {"TPU": 4.0}), (None, {"TPU": 4.0})])
    nodes[0]["resources_available"].pop("TPU")
    snap = build_snapshot(_raw(nodes, [pg]))
    assert snap.pending_owners == ["b"]
    assert _by_worker(snap)[0].owner == "b" and _by_worker(snap)[1].state == "free"


# --- health ---------------------------------------------------------------------------------

def test_dead_host() -> None:
    nodes = _slice()
    nodes[1]["alive"] = False
    nodes[1]["resources_available"] = {}
    s = build_snapshot(_raw(nodes)).slice(S0)
    assert (s.health, s.reasons, s.state) == ("degraded", ["worker 1 dead"], "degraded")
    assert (s.hosts[1].state, s.hosts[1].chip_states()) == ("dead", ["dead"] * 4)
    assert (s.hosts_alive, s.chips_total, s.chips_free) == (3, 12, 12)


def test_missing_host() -> None:
    s = build_snapshot(_raw(_slice(workers=range(3)))).slice(S0)
    assert s.reasons == ["worker 3 missing"]
    missing = s.hosts[3]
    assert (missing.node_id, missing.state, missing.chips) == (None, "missing", 0)
    assert missing.chip_states() == ["missing"] * 4
    assert (s.hosts_alive, s.hosts_expected) == (3, 4)


def test_no_worker_zero() -> None:
    s = build_snapshot(_raw(_slice(workers=range(1, 4)))).slice(S0)
    assert s.reasons == ["no worker 0"] and s.state == "degraded"
    assert s.hosts[0].state == "missing" and not s.head_locked


def test_chip_count_short() -> None:
    nodes = _slice()
    nodes[3] = _node(S0, 3, tpu=2)
    s = build_snapshot(_raw(nodes)).slice(S0)
    assert s.reasons == ["chip count short on worker 3 (2 of 4)"]
    assert s.hosts[3].chip_states() == ["free", "free", "missing", "missing"]


def test_worker_zero_without_head_resource() -> None:
    nodes = _slice()
    nodes[0] = _node(S0, 0, head=False)
    assert build_snapshot(_raw(nodes)).slice(S0).reasons == [
        "worker 0 has no TPU-v6e-16-head resource"]


def test_inconsistent_labels() -> None:
    nodes = _slice()
    nodes[1] = _node(S0, 1, topology="2x4", pod="v6e-8")
    nodes[2] = _node(S0, 2, pod="v6e-32")
    s = build_snapshot(_raw(nodes)).slice(S0)
    assert s.topology == "4x4" and s.health == "degraded"
    assert s.reasons == ["labels inconsistent: worker 1 says v6e:2x4, slice is v6e:4x4",
                         "labels inconsistent: worker 1 pod type v6e-8, topology 4x4 is v6e-16",
                         "labels inconsistent: worker 2 pod type v6e-32, topology 4x4 is v6e-16"]


def test_worker_id_outside_slice() -> None:
    nodes = [*_slice(), _node(S0, 7)]
    snap = build_snapshot(_raw(nodes))
    assert snap.slice(S0).reasons == ["labels inconsistent: worker 7 outside 4 hosts"]
    assert "worker 7 outside slice 'tpu-v6e-4x4-0'" in [n.reason for n in snap.other_nodes]


def test_replaced_host_keeps_slice_intact() -> None:
    nodes = _slice()
    old = _node(S0, 2, alive=False, node_id="dead" + "0" * 52)
    snap = build_snapshot(_raw([old, *nodes]))
    s = snap.slice(S0)
    assert (s.health, s.hosts[2].node_id) == ("intact", nodes[2]["node_id"])
    assert [n.node_id for n in snap.other_nodes if not n.is_head] == [old["node_id"]]


def test_two_live_nodes_claim_one_worker() -> None:
    nodes = [*_slice(), _node(S0, 1, node_id="twin" + "0" * 52)]
    s = build_snapshot(_raw(nodes)).slice(S0)
    assert s.reasons == ["labels inconsistent: worker 1 claimed by several live nodes"]


@pytest.mark.parametrize(
    ("node", "reason"),
    [
        (_node(None, None, tpu=0), "no TPU labels"),
        (_node(None, None), "TPU resource (4) but no TPU labels"),
        (_node(S0, None), "slice 'tpu-v6e-4x4-0' but no usable worker id (none)"),
        (_node(S0, "x"), "slice 'tpu-v6e-4x4-0' but no usable worker id (x)"),
        (_node(None, 0), "TPU labels but no slice name"),
    ],
)
def test_odd_nodes_go_to_other_nodes(node: dict[str, Any], reason: str) -> None:
    snap = build_snapshot(_raw([node]))
    assert snap.slices == []
    assert [n.reason for n in snap.other_nodes if not n.is_head][0].startswith(reason)


# --- shapes outside the topology tables -------------------------------------------------------

V2 = {"ray.io/accelerator-type": "TPU-V2"}
NO_SHAPE_LABELS = {"ray.io/tpu-pod-type": "", "ray.io/tpu-topology": ""}


def _unknown(spec: str, notes: tuple[str, ...] = ()) -> list[str]:
    return [f"unknown TPU shape {spec}: drawn from Ray's labels and resources", *notes]


@pytest.mark.parametrize(
    ("nodes", "pod_type", "topology", "hosts", "chips", "reasons"),
    [
        # A v2-8 / v3-8 TPU VM: one host of 4 chips (8 TensorCores), topology 2x2, which Ray's
        # VALID_TPU_TOPOLOGY has no entry for.
        ([_node("v2", 0, pod="v2-8", topology="2x2", labels=V2)], "v2-8", "2x2",
         ["free"], 4, _unknown("v2-8 (2x2)")),
        ([_node("v3", 0, pod="v3-8", topology="2x2",
                labels={"ray.io/accelerator-type": "TPU-V3"})], "v3-8", "2x2",
         ["free"], 4, _unknown("v3-8 (2x2)")),
        # Unknown generation, two hosts of 4: hosts from the topology's 8 chips.
        (_slice("odd", range(2), pod="v9z-16", topology="2x4"), "v9z-16", "2x4",
         ["free", "free"], 8, _unknown("v9z-16 (2x4)")),
        (_slice("odd", range(1), pod="v9z-16", topology="2x4"), "v9z-16", "2x4",
         ["free", "missing"], 4, [*_unknown("v9z-16 (2x4)"), "worker 1 missing"]),
        # Known generation, unknown topology: hosts from the pod type (Ray's rule).
        (_slice("odd", range(4), topology="banana"), "v6e-16", "banana",
         ["free"] * 4, 16, _unknown("v6e-16 (banana)")),
        (_slice("odd", range(4), topology="3x3"), "v6e-16", "3x3", ["free"] * 4, 16,
         _unknown("v6e-16 (3x3)",
                  ("labels inconsistent: pod type v6e-16 is 16 chip(s), topology 3x3 is 9",))),
        (_slice("odd", range(4), labels={"ray.io/tpu-topology": ""}), "v6e-16", "unknown",
         ["free"] * 4, 16, _unknown("v6e-16 (no topology label)")),
        # Nothing to derive the host count from: the hosts seen.
        (_slice("odd", range(3), labels=NO_SHAPE_LABELS), "unknown", "unknown",
         ["free"] * 3, 12, _unknown("v6e (no topology label)",
                                    ("host count unknown: drawn as the 3 host(s) seen",))),
    ],
)
def test_unknown_shape_is_drawn_as_a_slice(nodes: list[dict[str, Any]], pod_type: str,
                                           topology: str, hosts: list[str], chips: int,
                                           reasons: list[str]) -> None:
    snap = build_snapshot(_raw(nodes))
    [s] = snap.slices
    assert not s.shape_known and s.name == nodes[0]["labels"]["ray.io/tpu-slice-name"]
    assert (s.pod_type, s.topology, s.reasons) == (pod_type, topology, reasons)
    assert [h.state for h in s.hosts] == hosts
    assert (s.hosts_expected, s.hosts_alive, s.chips_total, s.chips_free) == (
        len(hosts), len(nodes), chips, chips)
    assert all(h.chip_states() == ["free"] * 4 for h in s.hosts if h.alive)
    assert [n.is_head for n in snap.other_nodes] == [True]
    assert (s.health, s.state, s.idle) == ("degraded", "degraded", False)
    assert (snap.total_chips, snap.idle_slices()) == (chips, [])
    data = json.loads(json.dumps(snap.to_dict()))["slices"][0]
    assert (data["shape_known"], data["reasons"]) == (False, reasons)


def test_v2_8_host_is_a_one_host_slice_with_its_chips_and_head() -> None:
    node = _node("tpu-v2-8", 0, pod="v2-8", topology="2x2", labels=V2, avail=1)
    pg = _pg("ef" * 18, "raytpu:mine", [(node["node_id"], {"TPU": 3.0})])
    snap = build_snapshot(_raw([node], [pg]))
    s = snap.slice("tpu-v2-8")
    assert (s.version, s.shape.num_hosts, s.shape.chips_per_host, s.shape.head_resource) == (
        "v2", 1, 4, "TPU-v2-8-head")
    assert s.hosts[0].chip_states() == ["reserved"] * 3 + ["free"]
    assert (s.owners, s.chips_reserved, s.chips_free) == (["mine"], 3, 1)
    assert [x.name for x in snap.slices_of("v2-8")] == ["tpu-v2-8"]


def test_unknown_shape_host_counts_worker_ids_and_head_checks() -> None:
    # Derived host count: a worker beyond it is set aside, as on a known shape.
    snap = build_snapshot(_raw(_slice("odd", [0, 1, 5], pod="v9z-16", topology="2x4")))
    s = snap.slice("odd")
    assert s.hosts_expected == 2 and "labels inconsistent: worker 5 outside 2 hosts" in s.reasons
    assert "worker 5 outside slice 'odd'" in [n.reason for n in snap.other_nodes]
    # No pod type: no head resource to check; a stray worker id draws at most MAX_UNKNOWN_HOSTS.
    from raytpu_lab.tpu.unknown import MAX_UNKNOWN_HOSTS

    nodes = [_node("odd", 0, labels=NO_SHAPE_LABELS), _node("odd", 10**6, labels=NO_SHAPE_LABELS)]
    s = build_snapshot(_raw(nodes)).slice("odd")
    assert s.hosts_expected == MAX_UNKNOWN_HOSTS and not any("head" in r for r in s.reasons)
    # A pod type: worker 0 must carry TPU-<pod type>-head, as on a known shape.
    s = build_snapshot(_raw([_node("v2", 0, pod="v2-8", topology="2x2", head=False)])).slice("v2")
    assert "worker 0 has no TPU-v2-8-head resource" in s.reasons
    # The emulator's expected host count wins over the labels.
    nodes = _slice("odd", range(2), pod="v9z-16", topology="2x4")
    assert build_snapshot(_raw(nodes), expected_hosts={"odd": 3}).slice("odd").hosts_expected == 3


def test_mixed_known_and_unknown_labels_in_one_slice() -> None:
    nodes = _slice()
    nodes[3] = _node(S0, 3, pod="v9z-16")
    s = build_snapshot(_raw(nodes)).slice(S0)
    assert s.shape_known and s.hosts[3].state == "free"
    assert s.reasons[0] == "labels inconsistent: worker 3 says v9z-16:4x4, slice is v6e:4x4"
    odd = _slice("odd", range(2), pod="v9z-16", topology="2x4")
    odd.append(_node("odd", 2, pod="v6e-16", topology="4x4"))
    s = build_snapshot(_raw(odd)).slice("odd")
    assert not s.shape_known
    assert "labels inconsistent: worker 2 says v6e:4x4, slice is v9z-16 (2x4)" in s.reasons


def test_pod_type_from_accelerator_label_when_pod_label_absent() -> None:
    nodes = _slice()
    for n in nodes:
        del n["labels"]["ray.io/tpu-pod-type"]
    s = build_snapshot(_raw(nodes)).slice(S0)
    assert (s.pod_type, s.health) == ("v6e-16", "intact")


def test_expected_hosts_sets_chips_per_host() -> None:
    # v6e 2x4 on 4-chip machines: 2 hosts of 4, where Ray's rule says 1 host of 8.
    nodes = _slice("s24", range(2), pod="v6e-8", topology="2x4")
    s = build_snapshot(_raw(nodes), expected_hosts={"s24": 2}).slice("s24")
    assert (s.hosts_expected, s.shape.chips_per_host, s.health) == (2, 4, "intact")
    default = build_snapshot(_raw(nodes)).slice("s24")
    assert default.health == "degraded" and default.hosts_expected == 1


def test_expected_hosts_disagreeing_with_topology() -> None:
    s = build_snapshot(_raw(_slice()), expected_hosts={S0: 3}).slice(S0)
    assert "expected 3 hosts, 4x4 has 4" in s.reasons


def test_slices_of_accepts_gke_spelling() -> None:
    nodes = _slice("ironwood", range(1), pod="v7x-8", topology="2x2x1")
    s = build_snapshot(_raw(nodes))
    assert [x.name for x in s.slices_of("tpu7x-8")] == ["ironwood"]
    assert s.slice("ironwood").state == "free"


def test_empty_and_sparse_raw_state() -> None:
    snap = build_snapshot({"fetched_at": 0.0, "nodes": [], "placement_groups": []})
    assert (snap.slices, snap.other_nodes, snap.head_node_id, snap.total_chips) == ([], [], None, 0)
    assert build_snapshot({}).slices == []


def test_placement_groups_of_known_jobs_count_as_busy_with_the_run_name() -> None:
    import json
    from pathlib import Path

    raw = json.loads((Path(__file__).parent / "fixtures" / "raw_v6e_4x4_x2_one_reserved.json").read_text())
    pg_id = next(pg["placement_group_id"] for pg in raw["placement_groups"] if pg["name"] == "raytpu:a")
    snap = build_snapshot(raw, jobs={pg_id: "run digits"})
    held = snap.slice("tpu-v6e-4x4-0")
    assert held.owners == ["run digits"]
    assert {h.state for h in held.hosts} == {"busy"}
    assert held.chips_busy == 16 and held.chips_reserved == 0 and held.state == "busy"
    assert snap.slice("tpu-v6e-4x4-1").state == "free"
