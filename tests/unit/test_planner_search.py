"""Placement policies on the two-model example, small enough to check by reasoning."""
import pytest

from specserve.planner.model_table import MODEL_TABLE, parse_cluster
from specserve.planner.search import layouts, plan
from specserve.planner.workload import multi_model

BERT67 = MODEL_TABLE["bert-6.7b"]
SPECS = {"a": BERT67, "b": BERT67}
SLO = {m: 5 * BERT67.latency_s for m in SPECS}


def test_layouts_follow_the_authors_enumeration():
    assert layouts(4, 8) == [[(1, 1)] * 4, [(1, 2)] * 2, [(2, 1)] * 2, [(1, 4)], [(2, 2)], [(4, 1)]]
    # 6 devices: groups of 4 leave 2 as a pipeline; groups of 1 and 2 divide evenly
    assert [(4, 1)] + [(2, 1)] in layouts(6, 8) and [(2, 2), (2, 1)] in layouts(6, 8)
    # 13 = 8 + 4 + 1 with size-8 groups; op never above 4, pp never above 8
    assert [(2, 4), (4, 1), (1, 1)] in layouts(13, 8)
    for layout in layouts(64, 8):
        assert sum(pp * op for pp, op in layout) == 64
        regular = layout[0]
        assert regular[0] <= 8 and regular[1] <= 4
    # a group bigger than a node is whole nodes: no 16-device group on 12-device nodes
    assert not any(pp * op == 16 for layout in layouts(24, 12) for pp, op in layout[:1])


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


def test_buckets_cut_at_latency_jumps():
    from specserve.planner.model_table import parse_models
    from specserve.planner.search import buckets
    specs = dict(parse_models("bert-1.3b:1,moe-1.3b:1,bert-6.7b:1,bert-104b:1"))
    # latencies 0.151, 0.150, 0.395, 4.6 s; a model joins the first bucket whose first model is within 38%
    assert buckets(specs) == [["bert-1.3b#0", "moe-1.3b#0"], ["bert-6.7b#0"], ["bert-104b#0"]]
    assert buckets(specs, 2.0) == [["bert-1.3b#0", "moe-1.3b#0", "bert-6.7b#0"], ["bert-104b#0"]]
    # measured against the bucket's first model, not the last one added: 0.171 joins 0.151 (13%),
    # 0.234 is 55% above 0.151 and starts its own
    specs = dict(parse_models("bert-1.3b:1,moe-2.4b:1,moe-5.3b:1"))
    assert buckets(specs) == [["bert-1.3b#0", "moe-2.4b#0"], ["moe-5.3b#0"]]


def test_scores_order_goodput_then_latency_then_replicas():
    from specserve.planner.search import Score
    assert Score(10, 50.0, 1).key() > Score(9, 1.0, 9).key()
    assert Score(10, 5.0, 1).key() > Score(10, 6.0, 9).key()  # same goodput: lower mean latency
    assert Score(10, 5.0, 3).key() > Score(10, 5.0, 2).key()  # then more replicas
    assert (Score(2, 1.0, 1) + Score(3, 2.0, 2)) == Score(5, 3.0, 3)


def test_the_fill_uses_memory_and_keeps_the_best_placement():
    """Four models, 16 devices: stopping at the first step that does not improve leaves memory
    unused; the fill goes on until nothing fits and keeps the best placement it saw."""
    from specserve.planner.model_table import parse_models
    from specserve.planner.search import SearchConfig
    specs = dict(parse_models("bert-1.3b:4"))
    slo = {m: 5 * s.latency_s for m, s in specs.items()}
    reqs = multi_model(list(specs), 20.0, 2.0, 300, 0)
    cluster = parse_cluster("2x8:16GB").with_budget(13)
    greedy = plan("selective-replication", specs, cluster, reqs, slo, cfg=SearchConfig(fill=False))
    filled = plan("selective-replication", specs, cluster, reqs, slo)
    used = lambda r: sum(len(g.models) for g in r.groups)  # noqa: E731
    assert used(filled) > used(greedy)
    assert used(filled) == 16 * 4  # every device holds 4 (4 x 2.4 GB <= 13 GB; a 5th model does not exist)
    assert filled.slo_attainment >= greedy.slo_attainment


def test_memory_budget_caps_what_a_device_holds():
    from specserve.planner.model_table import parse_models
    specs = dict(parse_models("bert-1.3b:6"))  # 2.4 GB: six fit in 16 GB, five in 13 GB
    slo = {m: 5 * s.latency_s for m, s in specs.items()}
    reqs = multi_model(list(specs), 4.0, 1.0, 100, 0)
    for budget, most in ((None, 6), (13.0, 5)):
        r = plan("round-robin", specs, parse_cluster("1x2:16GB").with_budget(budget), reqs, slo)
        assert max(len(g.models) for g in r.groups) == most
    # 13.4 GB models fit no device within 13 GB: round-robin deals them onto 2-stage pipelines
    r = plan("round-robin", SPECS, parse_cluster("1x4:16GB").with_budget(13), multi_model(["a", "b"], 1.0, 1.0, 100, 0),
             SLO)
    assert [(g.pp, sorted(g.models)) for g in r.groups] == [(2, ["a"]), (2, ["b"])] and r.slo_attainment > 0.9


def test_selective_replication_gives_a_too_big_model_its_smallest_pipeline():
    from specserve.planner.model_table import parse_models
    specs = dict(parse_models("bert-104b:1,bert-1.3b:2"))
    slo = {m: 5 * s.latency_s for m, s in specs.items()}
    reqs = multi_model(list(specs), 2.0, 1.0, 200, 0)
    r = plan("selective-replication", specs, parse_cluster("4x8:16GB"), reqs, slo)
    big = [g for g in r.groups if "bert-104b#0" in g.models]
    assert len(big) == 1 and (len(big[0].devices), big[0].pp, big[0].op) == (16, 16, 1)
    assert all(len(g.devices) == 1 for g in r.groups if g is not big[0])
    assert r.slo_attainment > 0.99


def test_alpaserve_beats_selective_replication_on_a_bursty_16_device_cluster():
    from specserve.planner.model_table import parse_models
    specs = dict(parse_models("bert-6.7b:8"))
    slo = {m: 5 * s.latency_s for m, s in specs.items()}
    reqs = multi_model(list(specs), 8.0, 4.0, 1000, 0)
    cluster = parse_cluster("2x8:16GB")
    alpa = plan("alpaserve", specs, cluster, reqs, slo)
    sr = plan("selective-replication", specs, cluster, reqs, slo)
    assert alpa.slo_attainment > sr.slo_attainment + 0.05
    assert any(g.pp * g.op > 1 for g in alpa.groups)  # it got there by model parallelism
    # every model is placed and every group fits its devices' memory
    assert {m for g in alpa.groups for m in g.models} == set(specs)
    assert sorted(d for g in alpa.groups for d in g.devices) == list(range(16))
