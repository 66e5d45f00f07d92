"""Cost model arithmetic, memory checks, and AlpaServe's two-model example at small scale."""
import pytest

from specserve.planner.cost_model import CostParams, analytic_costs
from specserve.planner.model_table import MODEL_TABLE, parse_cluster
from specserve.planner.placement import GroupPlan, to_sim_groups
from specserve.planner.simulator import simulate
from specserve.planner.workload import multi_model

BERT67 = MODEL_TABLE["bert-6.7b"]


def test_analytic_costs_by_hand():
    c = analytic_costs(BERT67, pp=2, op=1, params=CostParams(intra_overhead=0.1, boundary_s=0.002))
    # pp - 1 boundaries: every stage but the last sends its activations on
    assert c.stage_latency_s == pytest.approx([0.395 / 2 + 0.002, 0.395 / 2])
    assert c.memory_per_device_gb == pytest.approx(6.7)
    c = analytic_costs(BERT67, pp=1, op=4, params=CostParams(intra_overhead=0.1, boundary_s=0.002))
    assert c.stage_latency_s == pytest.approx([0.395 / 4 * 1.3]) and c.memory_per_device_gb == pytest.approx(3.35)
    c = analytic_costs(BERT67, pp=4, op=1, params=CostParams(boundary_s=0.002, request_overhead_s=0.012))
    assert c.stage_latency_s == pytest.approx([0.395 / 4 + 0.014] + [0.395 / 4 + 0.002] * 2 + [0.395 / 4])
    with pytest.raises(ValueError, match="request-overhead"):
        CostParams(request_overhead_s=-1)
    with pytest.raises(ValueError):
        analytic_costs(BERT67, pp=0, op=1)


def test_placement_that_does_not_fit_names_the_group():
    cluster = parse_cluster("1x2:16GB")
    specs = {"a": BERT67, "b": BERT67}
    with pytest.raises(ValueError, match=r"does not fit: group \[0\] .* needs 26.8 GB per device .* 16 GB"):
        to_sim_groups([GroupPlan([0], 1, 1, ["a", "b"])], specs, cluster)
    with pytest.raises(ValueError, match="used twice"):
        to_sim_groups([GroupPlan([0], 1, 1, ["a"]), GroupPlan([0], 1, 1, ["b"])], specs, cluster)
    with pytest.raises(ValueError, match="cannot run pp=2"):
        GroupPlan([0], 2, 1, ["a"])


def test_two_models_two_devices_model_parallel_wins_when_bursty():
    """AlpaServe's example: 2 x 13.4 GB models on 2 x 16 GB devices. Dedicated: one model per device.
    Model-parallel: both models on both devices as a 2-stage pipeline (6.7 GB each per device)."""
    cluster = parse_cluster("1x2:16GB")
    specs = {"a": BERT67, "b": BERT67}
    dedicated = to_sim_groups([GroupPlan([0], 1, 1, ["a"]), GroupPlan([1], 1, 1, ["b"])], specs, cluster)
    pipelined = to_sim_groups([GroupPlan([0, 1], 2, 1, ["a", "b"])], specs, cluster)
    slo = {m: 5 * BERT67.latency_s for m in specs}
    for cv, expect_gap in [(1.0, False), (4.0, True)]:
        reqs = multi_model(["a", "b"], rate=3.0, cv=cv, duration=2000, seed=0, weights=[0.8, 0.2])
        ded, pip = simulate(dedicated, reqs, slo).slo_attainment, simulate(pipelined, reqs, slo).slo_attainment
        assert pip >= ded
        if expect_gap:
            assert pip - ded > 0.02
