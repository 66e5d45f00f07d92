"""The numba event loop against the plain-Python heap simulator (planner/reference.py), request for
request: every request's outcome (dropped, or its finish time) must agree."""
import numpy as np
import pytest

from specserve.planner.reference import simulate_reference
from specserve.planner.simulator import Arrival, Group, Trace, simulate
from specserve.planner.workload import multi_model

MODELS = ["a", "b", "c", "d"]


def _trace(rate, cv, duration, seed, models=MODELS):
    return Trace.from_requests(multi_model(models, rate, cv, duration, seed), models)


SCENARIOS = {
    # 4 models, 0.1 s each, SLO 0.5 s, an uneven replicated placement (issue 17's comparison case)
    "replicas-uneven": ([Group([0], {"a": [0.1], "b": [0.1]}), Group([1], {"a": [0.1], "c": [0.1]}),
                         Group([2], {"a": [0.1], "d": [0.1]}), Group([3], {"b": [0.1]})],
                        dict.fromkeys(MODELS, 0.5), (24.0, 4.0, 300.0)),
    # pipelines with uneven stages next to single devices; models with different stage counts
    "pipelines-uneven": ([Group([0, 1], {"a": [0.05, 0.12], "b": [0.2, 0.03]}, pp=2),
                          Group([2, 3, 4], {"a": [0.04, 0.04, 0.09], "c": [0.1, 0.02, 0.05]}, pp=3),
                          Group([5], {"b": [0.22], "d": [0.3]}), Group([6], {"d": [0.3], "c": [0.16]})],
                         {"a": 0.6, "b": 0.8, "c": 0.5, "d": 1.2}, (12.0, 3.0, 400.0)),
    # one model on three replicas under heavy bursts: queues drain and refill all the time
    "bursty-replicas": ([Group([0], {"a": [0.25]}), Group([1], {"a": [0.25]}), Group([2, 3], {"a": [0.1, 0.16]}, pp=2)],
                        {"a": 1.0}, (10.0, 6.0, 600.0)),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
@pytest.mark.parametrize("seed", [0, 1])
def test_numba_loop_matches_the_reference_request_for_request(name, seed):
    groups, slo, (rate, cv, duration) = SCENARIOS[name]
    models = sorted({m for g in groups for m in g.models})
    trace = _trace(rate, cv, duration, seed, models)
    fast = simulate(groups, trace, slo)
    ref = np.asarray(simulate_reference(groups, trace, slo))
    assert len(trace) > 1000
    np.testing.assert_array_equal(np.isnan(fast.finish), np.isnan(ref))  # same requests dropped
    np.testing.assert_allclose(fast.finish, ref, rtol=0, atol=1e-9)
    # the scenario must exercise both outcomes, or it checks nothing about admission
    assert 0.05 < fast.slo_attainment < 0.999


def test_reference_on_the_drained_replica_case():
    groups = [Group([0], {"a": [1.0]}), Group([1], {"a": [1.0]})]
    trace = Trace.from_requests([Arrival(t, "a") for t in [0, 1.5, 3, 3.5, 5, 5.2]], ["a"])
    assert simulate_reference(groups, trace, {"a": 1.0}) == [1.0, 2.5, 4.0, 4.5, 6.0, 6.2]
