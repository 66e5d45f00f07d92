"""The bench's speedup intervals: bootstrap over paired rounds."""
from specserve_bench.spec import speedup_interval


def _runs(values, tokens=100):
    return [{"all": v, "first": v, "tokens": tokens, "wall": v * tokens} for v in values]


def test_interval_brackets_the_ratio_and_narrows_with_agreeing_rounds():
    rd = _runs([0.060, 0.058, 0.061, 0.059, 0.060, 0.062, 0.057, 0.060])
    sp = _runs([v / 1.25 for v in [0.060, 0.058, 0.061, 0.059, 0.060, 0.062, 0.057, 0.060]])
    lo, hi = speedup_interval(rd, sp, "all")
    assert lo == hi == 1.25  # every round says 1.25x: nothing left uncertain
    lo, hi = speedup_interval(rd, sp, "tokens_per_s")
    assert lo == hi == 1.25


def test_noisy_rounds_give_an_interval_that_contains_the_mean_ratio_and_not_far_values():
    rd = _runs([0.060, 0.050, 0.070, 0.055, 0.065, 0.060])
    sp = _runs([0.066, 0.045, 0.080, 0.050, 0.070, 0.058])  # some rounds faster, some slower
    lo, hi = speedup_interval(rd, sp, "all")
    point = sum(r["all"] for r in rd) / sum(s["all"] for s in sp)
    assert lo < point < hi
    assert lo > 0.85 and hi < 1.15
    assert hi - lo > 0.02  # disagreeing rounds do leave the ratio uncertain
