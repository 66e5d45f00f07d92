"""Placement policies on the two-model example, small enough to check by reasoning."""
import pytest

from specserve.planner.models import MODEL_TABLE, parse_cluster
from specserve.planner.search import partitions, plan
from specserve.planner.workload import multi_model

BERT67 = MODEL_TABLE["bert-6.7b"]
SPECS = {"a": BERT67, "b": BERT67}
SLO = {m: 5 * BERT67.latency_s for m in SPECS}


def test_partitions_are_power_of_two_groups_with_every_factorisation():
    assert partitions(parse_cluster("1x4:16GB")) == [(1, 1, 1), (2, 1, 2), (2, 2, 1), (4, 1, 4), (4, 2, 2), (4, 4, 1)]


def test_round_robin_one_model_per_device_when_only_one_fits():
    r = plan("round-robin", SPECS, parse_cluster("1x2:16GB"), multi_model(["a", "b"], 1.0, 1.0, 100, 0), SLO)
    assert [g.models for g in r.groups] == [["a"], ["b"]]


def test_alpaserve_picks_the_shared_pipeline_when_bursty_and_beats_baselines():
    cluster = parse_cluster("1x2:16GB")
    reqs = multi_model(["a", "b"], rate=3.0, cv=4.0, duration=1000, seed=0)
    alpa = plan("alpaserve", SPECS, cluster, reqs, SLO)
    sr = plan("selective-replication", SPECS, cluster, reqs, SLO)
    rr = plan("round-robin", SPECS, cluster, reqs, SLO)
    # 13.4 GB models: one per 16 GB device, or both split over two devices (6.7 GB each per device)
    assert len(alpa.groups) == 1 and sorted(alpa.groups[0].models) == ["a", "b"]
    assert len(alpa.groups[0].devices) == 2
    assert alpa.slo_attainment > sr.slo_attainment + 0.05 and sr.slo_attainment == pytest.approx(rr.slo_attainment)
    assert alpa.planning_time_s > 0


def test_unknown_policy():
    with pytest.raises(ValueError, match="unknown policy 'best'"):
        plan("best", SPECS, parse_cluster("1x2:16GB"), [], SLO)
