"""Model sets, clusters and workloads of the planner, and their one-line errors."""
import numpy as np
import pytest

from specserve.planner.model_table import MODEL_TABLE, parse_cluster, parse_models
from specserve.planner.workload import gamma_arrivals, load_trace, multi_model


def test_model_sets_and_lists():
    s3 = parse_models("S3")
    assert len(s3) == 70 and len({spec.name for _, spec in s3}) == 7
    assert [n for n, _ in parse_models("bert-6.7b:2")] == ["bert-6.7b#0", "bert-6.7b#1"]
    assert parse_models("S2")[0][1] == MODEL_TABLE["bert-6.7b"]
    with pytest.raises(ValueError, match="unknown model or set 's9'"):
        parse_models("S9")
    with pytest.raises(ValueError, match="positive integer"):
        parse_models("bert-1.3b:0")


def test_cluster_spec():
    c = parse_cluster("8x8:16GB")
    assert (c.nodes, c.devices_per_node, c.device_memory_gb, c.num_devices) == (8, 8, 16.0, 64)
    with pytest.raises(ValueError, match="NODESxDEVICES:MEMORY"):
        parse_cluster("eight GPUs")


@pytest.mark.parametrize("cv", [1.0, 4.0])
def test_gamma_arrivals_have_the_asked_rate_and_cv(cv):
    rng = np.random.default_rng(0)
    t = gamma_arrivals(rate=50.0, cv=cv, duration=2000.0, rng=rng)
    gaps = np.diff(t)
    n = len(gaps)
    # mean gap 1/rate with standard error cv/(rate sqrt(n)); allow 5 standard errors
    assert abs(gaps.mean() - 1 / 50.0) < 5 * cv / 50.0 / np.sqrt(n)
    assert abs(gaps.std() / gaps.mean() - cv) < 0.1 * cv
    assert np.all(gaps >= 0) and t[-1] < 2000.0


def test_multi_model_is_seeded_and_sorted():
    a = multi_model(["x", "y"], rate=10, cv=2, duration=50, seed=3)
    b = multi_model(["x", "y"], rate=10, cv=2, duration=50, seed=3)
    assert [(r.arrival, r.model) for r in a] == [(r.arrival, r.model) for r in b]
    assert all(p.arrival <= q.arrival for p, q in zip(a, a[1:])) and {r.model for r in a} == {"x", "y"}


def test_trace_layouts(tmp_path):
    per_request = tmp_path / "req.csv"
    per_request.write_text("timestamp,model,input_tokens,output_tokens\n0.5,m1,10,5\n0.1,m2,3,4\n")
    reqs = load_trace(str(per_request), ["m1", "m2"])
    assert [(r.arrival, r.model) for r in reqs] == [(0.1, "m2"), (0.5, "m1")]

    azure = tmp_path / "azure.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                     "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n")
    reqs = load_trace(str(azure), ["m1", "m2"], time_scale=0.5)
    assert reqs[0].arrival == 0.0 and reqs[1].arrival == pytest.approx((50.995169 - 46.68059) * 0.5)

    functions = tmp_path / "fn.csv"
    functions.write_text("HashOwner,HashApp,HashFunction,Trigger,1,2,3\no,a,f1,http,2,0,1\no,a,f2,timer,0,3,0\n")
    reqs = load_trace(str(functions), ["m1", "m2"], seed=1)
    assert sum(r.model == "m1" for r in reqs) == 3 and sum(r.model == "m2" for r in reqs) == 3
    assert all(60 <= r.arrival < 120 for r in reqs if r.model == "m2")


def test_malformed_traces_say_what_is_wrong(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match=r"bad\.csv: malformed trace: unknown layout"):
        load_trace(str(bad), ["m"])
    bad.write_text("timestamp,model\nsoon,m\n")
    with pytest.raises(ValueError, match=r"bad\.csv: malformed trace"):
        load_trace(str(bad), ["m"])
    bad.write_text("timestamp,model\n1.0,other\n")
    with pytest.raises(ValueError, match="not among the placed models"):
        load_trace(str(bad), ["m"])
    with pytest.raises(ValueError, match="cannot read trace"):
        load_trace(str(tmp_path / "missing.csv"), ["m"])


def test_planner_imports_no_torch():
    import subprocess
    import sys
    code = ("import sys, specserve.planner.simulator, specserve.planner.workload, specserve.planner.model_table, "
            "specserve.planner.search, specserve.planner.sweep, specserve.planner.cost_model, specserve.planner.placement, "
            "specserve.planner.reference, specserve.planner.llm, specserve.planner.llm_search, "
            "specserve.kv.block_manager, specserve.scheduler.scheduler; print('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
