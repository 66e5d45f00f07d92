"""The placement file `specserve serve --placement` reads (cluster/placement.py): what it accepts, each
replica's engine arguments, and one line naming the file and the fault for what it refuses."""
import json

import pytest

from specserve.cluster.placement import PlacementError, ReplicaSpec, ServePlacement

GOOD = {"models": {"coder": {"model": "qwen2.5-coder-1.5b", "speculative": "auto"}, "small": {"model": None}},
        "replicas": [{"model": "coder"}, {"model": "coder", "num_cpus": 1, "overrides": {"speculative": "suffix"}},
                     {"model": "small", "node": "10.0.0.2", "device": 1, "cores": [1]}]}


def test_a_placement_reads_and_writes_back_the_same():
    p = ServePlacement.from_dict(GOOD)
    assert p.replicas == [ReplicaSpec("coder"), ReplicaSpec("coder", num_cpus=1.0, overrides={"speculative": "suffix"}),
                          ReplicaSpec("small", node="10.0.0.2", device=1, cores=(1,))]
    assert ServePlacement.from_dict(p.to_dict()) == p


def test_a_replica_gets_its_models_arguments_with_its_own_overrides():
    p = ServePlacement.from_dict(GOOD)
    assert p.engine_kwargs(0) == {"model": "qwen2.5-coder-1.5b", "speculative": "auto"}
    assert p.engine_kwargs(1) == {"model": "qwen2.5-coder-1.5b", "speculative": "suffix"}
    assert p.engine_kwargs(2) == {"model": None}


def test_a_planners_devices_become_one_replica_per_model_a_device_holds():
    p = ServePlacement.from_devices([(["m0", "m1"], ["m1"]), (["m0"], [])], {"m0": {"model": None}, "m1": {"model": "x"}},
                                    {"speculative": "draft"})
    assert [(r.model, r.device, r.overrides) for r in p.replicas] == [
        ("m0", 0, {}), ("m1", 0, {"speculative": "draft"}), ("m0", 1, {})]


@pytest.mark.parametrize("change, why", [
    (lambda d: d.pop("models"), '"models"'),
    (lambda d: d["models"]["coder"].pop("model"), 'model "coder" needs "model"'),
    (lambda d: d.update(replicas=[]), '"replicas"'),
    (lambda d: d["replicas"].append({"model": "gamma"}), "replica 3 names no model"),
    (lambda d: d["replicas"][0].update(gpus=1), "unknown keys ['gpus']"),
    (lambda d: d["replicas"][0].update(num_cpus=-1), "num_cpus must be a number >= 0"),
    (lambda d: d["replicas"][0].update(overrides={"model": "y"}), '"overrides" must be'),
    (lambda d: d.update(replicas=[{"model": "coder"}]), "models without a replica: small"),
    (lambda d: d["replicas"][0].update(cores=[]), '"cores" must be a non-empty list'),
    (lambda d: d["replicas"][0].update(cores=["0"]), '"cores" must be a non-empty list'),
])
def test_what_cannot_be_served_is_refused_in_one_line(change, why):
    d = json.loads(json.dumps(GOOD))
    change(d)
    with pytest.raises(PlacementError, match=None) as e:
        ServePlacement.from_dict(d)
    assert why in str(e.value) and "\n" not in str(e.value)


def test_a_file_that_is_missing_or_not_json_is_named(tmp_path):
    with pytest.raises(PlacementError, match="nope.json: No such file"):
        ServePlacement.load(str(tmp_path / "nope.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{models: 1")
    with pytest.raises(PlacementError, match="bad.json: not JSON"):
        ServePlacement.load(str(bad))
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    with pytest.raises(PlacementError, match='empty.json: a placement needs "models"'):
        ServePlacement.load(str(empty))


def test_the_router_counts_every_replica_on_a_device():
    """Devices 0 and 1 each hold a and b (the planner's "replicated"): with one request of a in flight
    on device 0, b's next goes to device 1, not to its own idle replica beside a's busy one."""
    from specserve.cluster.router import ModelReplicas, ReplicaState, share_devices
    specs = [ReplicaSpec(m, device=d) for d in (0, 1) for m in ("a", "b")]
    states = [ReplicaState(i, s.model, actor=None) for i, s in enumerate(specs)]
    share_devices(states, specs)
    info = {"tokenizer": None, "max_model_len": 64, "cache_tokens": 64}
    a = ModelReplicas("a", [states[0], states[2]], info)
    b = ModelReplicas("b", [states[1], states[3]], info)
    assert a.pick() is states[0] and b.pick() is states[1]  # nothing in flight: lower index
    states[0].in_flight = 1
    assert b.pick() is states[3] and a.pick() is states[2]
    states[2].in_flight = 2  # device 1 now busier: b goes back to device 0
    assert b.pick() is states[1]
    alone = [ReplicaState(i, "a", actor=None) for i in range(2)]
    share_devices(alone, [ReplicaSpec("a"), ReplicaSpec("a")])  # no device named: each on its own
    alone[0].in_flight = 1
    assert ModelReplicas("a", alone, info).pick() is alone[1]
