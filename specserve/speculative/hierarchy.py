"""The expected gain of speculative decoding with a chain of drafters (the MIT 6.s898 report's formula,
built on Leviathan et al. 2023, Theorem 3.8).

One level: a drafter whose pass costs c target steps, proposing k tokens each accepted with
probability alpha (independently), makes a target step emit (1 - alpha^(k+1)) / (1 - alpha) tokens for
the time of k draft passes and one target pass:

    gain(alpha, c, k) = (1 - alpha^(k+1)) / ((1 - alpha) (k c + 1))

The 1 is the verify pass, priced as one plain pass of the model above: true on a GPU, where k + 1 rows
cost what one does; on a CPU they do not, so `Level.v` takes the measured ratio instead (the target's
step-time curve), and the engine reports both predictions.

Several levels (target <- draft_1 <- draft_2 <- ...): level i + 1 speeds up level i's drafting by its
own gain, so level i's cost as seen from above shrinks to c_i / gain_{i+1}. The chain's gain is the
top level's gain with that effective cost. Torch-free and exact arithmetic, unit-tested against
brute-force simulation in tests/unit/test_hierarchy.py."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Sequence


@dataclass(frozen=True)
class Level:
    """One drafter's pair with the model above it: the acceptance rate of its tokens, its pass time
    over the pass time of the model above, and how many tokens it proposes per round."""

    alpha: float
    c: float
    k: float
    # the verify pass's cost over one plain pass of the model above: 1 in the formula (a GPU verifies
    # k + 1 rows for the price of one); on a CPU each row costs, and the measured ratio goes here
    v: float = 1.0


def expected_tokens(alpha: float, k: float) -> float:
    """Tokens one verify round emits: the accepted drafts plus the verifier's own token."""
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1.0)) / (1.0 - alpha)


def gain(alpha: float, c: float, k: float, v: float = 1.0) -> float:
    """Leviathan's expected walltime improvement of one level (v: the verify pass over a plain one)."""
    return expected_tokens(alpha, k) / (k * c + v)


def chain_gain(levels: Sequence[Level]) -> float:
    """The gain of target <- levels[0] <- levels[1] <- ...: levels[i].c is relative to the model above
    it (levels[0].c to the target). An empty chain gains nothing (1.0)."""
    speedup = 1.0
    for lv in reversed(levels):
        speedup = gain(lv.alpha, lv.c / speedup, lv.k, lv.v)
    return speedup


def measured_chain(stats, costs, report: dict, c_top: Optional[float]) -> dict:
    """What speculation measured, as the formula's levels, top down: the target's pair (alpha and draft
    length from stats: SpecStats; c: the first stage's pass over the target's batch-1 step from costs:
    CostModel, or c_top for a drafter without stages), then one pair per stage of staged drafting
    (drafter.report()["stages"]: a stage's alpha, k and its helper's cost per proposal over its own
    pass); and the gains they predict: as published, and with the target's verify pass priced on its
    measured step-time curve (`_cpu`)."""
    stages = report.get("stages") or []
    t_target = costs.step_seconds(1)
    if stages:
        top = stages[0]["pass_seconds"] / t_target if stages[0]["pass_seconds"] and t_target else None
    else:
        top = c_top
    pairs = [{"pair": f"target <- {stages[0]['stage'] if stages else 'drafter'}", "alpha": stats.alpha, "c": top,
              "k": stats.mean_draft_len}]
    for st in stages:
        c = st["token_seconds"] / st["pass_seconds"] if st["token_seconds"] and st["pass_seconds"] else None
        pairs.append({"pair": f"{st['stage']} <- {st['helper']}", "alpha": st["alpha"], "c": c, "k": st["k"]})
    out = {"stages": pairs,
           # the draft models run and how often (memory traffic)
           "stage_models": [{"stage": st["stage"], "passes": st["passes"], "weight_bytes": st["weight_bytes"]}
                            for st in stages] or report.get("models", []),
           "stage_pass_seconds": stages[0]["pass_seconds"] if stages else None}
    rest = {k: v for k, v in report.items() if k not in ("stages", "models")}
    if rest:  # what else the drafter reports (the automatic drafter: its choices)
        out["drafter"] = rest
    if not all(p[x] is not None for p in pairs for x in ("alpha", "c", "k")):
        return out
    levels = [Level(p["alpha"], p["c"], p["k"]) for p in pairs]
    out.update(predicted_gain=chain_gain(levels), predicted_gain_without_staging=chain_gain(levels[:1]))
    curve = costs.step_curve(1, 1 + round(pairs[0]["k"]), 1)
    if curve is not None and all(t is not None for t in curve):
        cpu = replace(levels[0], v=curve[-1] / curve[0])
        out.update(verify_cost=cpu.v, predicted_gain_cpu=chain_gain([cpu] + levels[1:]),
                   predicted_gain_cpu_without_staging=chain_gain([cpu]))
    return out
