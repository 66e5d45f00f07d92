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

from dataclasses import dataclass
from typing import Sequence


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
