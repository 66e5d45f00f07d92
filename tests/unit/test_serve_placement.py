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
