"""The simulator on cases small enough to compute by hand."""
import numpy as np
import pytest

from specserve.planner.simulator import Arrival, Group, simulate


def reqs(times, model="a"):
    return [Arrival(t, model) for t in times]


def test_one_device_fifo_queue():
    g = Group(devices=[0], stage_latency={"a": [1.0]})
    res = simulate([g], reqs([0.0, 0.5, 1.0, 3.0]), slo={"a": 10.0})
    # finishes at 1, 2, 3, 4 -> latencies 1, 1.5, 2, 1
    np.testing.assert_allclose(res.finish, [1.0, 2.0, 3.0, 4.0])
    np.testing.assert_allclose(res.latencies, [1.0, 1.5, 2.0, 1.0])
    assert res.slo_attainment == 1.0
    assert res.busy_time[0] == pytest.approx(4.0) and res.horizon == pytest.approx(4.0)


def test_two_stage_pipeline_overlaps_requests():
    g = Group(devices=[0, 1], stage_latency={"a": [0.5, 0.5]}, pp=2)
    res = simulate([g], reqs([0.0, 0.1, 0.2]), slo={"a": 10.0})
    # stage 1 frees every 0.5 s: finishes at 1.0, 1.5, 2.0
    np.testing.assert_allclose(res.finish, [1.0, 1.5, 2.0])
    np.testing.assert_allclose(res.latencies, [1.0, 1.4, 1.8])
    assert res.busy_time == {0: pytest.approx(1.5), 1: pytest.approx(1.5)}


def test_uneven_stages_wait_for_the_slow_one():
    g = Group(devices=[0, 1], stage_latency={"a": [0.2, 1.0]}, pp=2)
    res = simulate([g], reqs([0.0, 0.0]), slo={"a": 10.0})
    # second request leaves stage 1 at 0.4 but stage 2 is busy until 1.2: finishes 2.2
    np.testing.assert_allclose(res.finish, [1.2, 2.2])


def test_requests_that_would_miss_the_deadline_are_dropped():
    g = Group(devices=[0], stage_latency={"a": [1.0]})
    res = simulate([g], reqs([0.0, 0.0, 0.0, 1.2]), slo={"a": 1.5})
    # 1st: done at 1 (ok); 2nd and 3rd would end at 2 (latency 2 > 1.5): dropped, no device time;
    # 4th starts at 1.2 when the device is free: done at 2.2
    assert np.isnan(res.finish[1]) and np.isnan(res.finish[2])
    np.testing.assert_allclose(res.finish[[0, 3]], [1.0, 2.2])
    assert res.slo_attainment == pytest.approx(0.5) and res.busy_time[0] == pytest.approx(2.0)


def test_shortest_queue_dispatch_and_unserved_models():
    g0 = Group(devices=[0], stage_latency={"a": [1.0]})
    g1 = Group(devices=[1], stage_latency={"a": [1.0], "b": [1.0]})
    res = simulate([g0, g1], [Arrival(0.0, "a"), Arrival(0.0, "a"), Arrival(0.0, "c")], slo={"a": 5, "b": 5, "c": 5})
    # the two a-requests go to different groups (both finish at 1); nobody serves c
    np.testing.assert_allclose(res.finish[:2], [1.0, 1.0])
    assert np.isnan(res.finish[2]) and res.per_model_good == {"a": (2, 2), "c": (0, 1)}


def test_unsorted_requests_are_an_error():
    with pytest.raises(ValueError, match="sorted"):
        simulate([Group([0], {"a": [1.0]})], reqs([1.0, 0.0]), slo={"a": 1.0})


def test_scoring_one_added_replica_matches_simulating_it():
    """The search scores 'this placement plus one replica' without building it; same event loop."""
    from specserve.planner.simulator import run_trace, score_additions
    rng = np.random.default_rng(0)
    arrival = np.sort(rng.uniform(0, 20, 400))
    model = rng.integers(0, 3, 400)
    slo = np.array([1.0, 2.0, 1.5])
    served = np.array([[True, False, False], [False, True, True], [False, False, False]])
    lat = rng.uniform(0.05, 0.4, (3, 3, 2))
    stages = np.array([2, 2, 2])
    adds = [(0, 1), (2, 0), (2, 2), (1, 0)]
    got, lat_sums = score_additions(arrival, model, slo, served, lat, stages, np.array([g for g, _ in adds]),
                          np.array([m for _, m in adds]), np.stack([lat[g, m] for g, m in adds]))
    for (g, m), score, lat_sum in zip(adds, got, lat_sums):
        with_it = served.copy()
        with_it[g, m] = True
        finish, busy = np.empty(400), np.zeros((3, 2))
        assert score == run_trace(arrival, model, slo, with_it, lat, stages, -1, -1, lat[0, 0], finish, busy)
        assert lat_sum == pytest.approx(np.nansum(finish - arrival))
        assert 0 < score < 400


# --- queues that drain and refill: the routing must count what is outstanding now --------------

def test_a_drained_replica_takes_new_requests_again():
    """Issue 17's case. Two groups serve a (1 s, SLO 1 s). By hand, fewest outstanding, ties to g0:
    0->g0 (done 1), 1.5->g0 (2.5), 3->g0 (4), 3.5->g1 (4.5), 5->g0 (6), 5.2->g1 (6.2): all in SLO.
    The old loop lost track of g0's queue once it drained and dropped the last request (0.833)."""
    groups = [Group([0], {"a": [1.0]}), Group([1], {"a": [1.0]})]
    res = simulate(groups, reqs([0, 1.5, 3, 3.5, 5, 5.2]), slo={"a": 1.0})
    np.testing.assert_allclose(res.finish, [1.0, 2.5, 4.0, 4.5, 6.0, 6.2])
    assert res.slo_attainment == 1.0
    assert res.busy_time == {0: pytest.approx(4.0), 1: pytest.approx(2.0)}


def test_replicas_drain_refill_and_drain_again():
    """Two replicas, 1 s each, SLO 2.5 s; three bursts with idle gaps between them.
    Burst 1 at 0 x4: g0, g1, g0, g1 -> 1, 1, 2, 2. Both drain by 2.
    Burst 2 at 10 x5: g0 (11), g1 (11), g0 (12), g1 (12), g0 would end 13 (latency 3 > 2.5): dropped.
    At 12.5 g0 and g1 hold nothing: g0 (13.5). At 12.6: g0 1, g1 0 -> g1 (13.6)."""
    groups = [Group([0], {"a": [1.0]}), Group([1], {"a": [1.0]})]
    res = simulate(groups, reqs([0, 0, 0, 0, 10, 10, 10, 10, 10, 12.5, 12.6]), slo={"a": 2.5})
    want = [1, 1, 2, 2, 11, 11, 12, 12, np.nan, 13.5, 13.6]
    np.testing.assert_allclose(res.finish, want)
    assert res.num_good == 10


def test_uneven_pipeline_drops_then_recovers():
    """pp=2 stages [0.3, 0.7], SLO 2: 0 -> s0 0-0.3, s1 0.3-1.0; 0.1 -> s0 0.3-0.6, s1 1.0-1.7 (1.6);
    0.2 -> s1 would run 1.7-2.4 (2.2 > 2): dropped; 2.0 -> s0 2.0-2.3, s1 2.3-3.0."""
    g = Group([0, 1], {"a": [0.3, 0.7]}, pp=2)
    res = simulate([g], reqs([0.0, 0.1, 0.2, 2.0]), slo={"a": 2.0})
    np.testing.assert_allclose(res.finish, [1.0, 1.7, np.nan, 3.0])
    assert res.busy_time == {0: pytest.approx(0.9), 1: pytest.approx(2.1)}


def test_without_numba_only_the_planner_refuses_in_one_line(tmp_path):
    """numba is the planner's extra: without it the CLI still starts, and `specserve plan` says what to
    install (exit 2, one line) instead of a traceback."""
    import subprocess
    import sys
    block = "import sys; sys.modules['numba'] = None; from specserve.cli.main import main; "
    help_ = subprocess.run([sys.executable, "-c", block + "sys.exit(main(['generate', '--help']))"],
                           capture_output=True, text=True, timeout=120)
    assert help_.returncode == 0 and "--max-tokens" in help_.stdout
    plan = subprocess.run([sys.executable, "-c", block + "sys.exit(main(['plan', '--duration', '5']))"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    lines = plan.stderr.strip().splitlines()
    assert plan.returncode == 2 and len(lines) == 1 and "pip install 'specserve[planner]'" in lines[0], plan.stderr
