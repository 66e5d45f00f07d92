"""Sweep bookkeeping and the two-model example's shape."""
import pytest

from specserve.planner.sweep import SweepConfig, summarise, sweep, threshold, two_model_example


def test_threshold_interpolates_the_99_percent_crossing():
    assert threshold([1, 2, 4], [1.0, 0.995, 0.98]) == (pytest.approx(2 + 2 * (0.005 / 0.015)), False)
    assert threshold([1, 2], [0.98, 0.9]) == (None, False)
    assert threshold([1, 2], [1.0, 0.999]) == (2, True)  # never missed: a lower bound


def test_summary_factor_over_selective_replication():
    rows = [{"axis": "rate", "policy": p, "rate": x, "slo_attainment": y}
            for p, pts in {"alpaserve": [(1, 1.0), (2, 1.0), (4, 0.98)],
                           "selective-replication": [(1, 1.0), (2, 0.97), (4, 0.9)]}.items() for x, y in pts]
    s = summarise(rows, ("alpaserve", "selective-replication"))["rate"]
    sr = 1 + 0.01 / 0.03
    a = 2 + 2 * 0.01 / 0.02
    assert s["factor_alpaserve_over_sr"] == pytest.approx(a / sr) and not s["factor_is_lower_bound"]


def test_two_model_example_model_parallel_wins_more_as_bursts_grow():
    rows = two_model_example()["rows"]
    gaps = [r["gap"] for r in rows]
    assert all(g >= -1e-9 for g in gaps)
    assert all(b >= a - 0.005 for a, b in zip(gaps, gaps[1:]))  # grows with CV (up to simulation noise)
    assert gaps[0] < 0.01 and gaps[-1] > 0.1


def test_small_sweep_runs_every_axis_and_policy():
    cfg = SweepConfig(models="bert-6.7b:4", cluster="2x4:16GB", rate=2.0, requests=400, rate_factors=(0.5, 1.0),
                      cvs=(1.0, 4.0), slo_scales=(5.0,), device_counts=(4, 8))
    r = sweep(cfg)
    assert len(r["rows"]) == (2 + 2 + 1 + 2) * 3
    assert {row["policy"] for row in r["rows"]} == set(cfg.policies)
    assert all(0 <= row["slo_attainment"] <= 1 for row in r["rows"])
    assert set(r["summary"]) == {"rate", "cv"}
