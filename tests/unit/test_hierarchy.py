"""The expected-gain formula of speculative decoding with chains of drafters (speculative/hierarchy.py),
checked against brute-force simulation of verify rounds."""
import random

import pytest

from specserve.speculative.hierarchy import Level, chain_gain, expected_tokens, gain


def _simulate(alpha, c, k, v=1.0, rounds=200_000, seed=0):
    """Rounds of k drafts, each accepted with probability alpha until the first rejection, plus the
    verifier's own token; time k c + v per round (in verifier steps). -> tokens per unit of time."""
    rng = random.Random(seed)
    tokens = 0
    for _ in range(rounds):
        n = 0
        while n < k and rng.random() < alpha:
            n += 1
        tokens += n + 1
    return tokens / (rounds * (k * c + v))


@pytest.mark.parametrize("alpha, c, k, v", [(0.6, 0.1, 4, 1.0), (0.85, 0.3, 6, 1.0), (0.3, 0.05, 2, 1.4), (0.0, 0.1, 3, 1.0)])
def test_one_level_matches_simulation(alpha, c, k, v):
    assert gain(alpha, c, k, v) == pytest.approx(_simulate(alpha, c, k, v), rel=0.01)


def test_limits():
    assert expected_tokens(1.0, 4) == 5 and expected_tokens(0.0, 4) == 1
    assert gain(1.0, 0.0, 4) == 5.0  # free, perfect drafts: k + 1 tokens per step
    assert chain_gain([]) == 1.0
    assert chain_gain([Level(0.7, 0.2, 4)]) == gain(0.7, 0.2, 4)


def test_a_lower_stage_divides_the_cost_of_the_one_above_by_its_own_gain():
    top, low = Level(0.8, 0.5, 4), Level(0.6, 0.05, 3)
    assert chain_gain([top, low]) == pytest.approx(gain(0.8, 0.5 / gain(0.6, 0.05, 3), 4))
    assert chain_gain([top, low]) > chain_gain([top])  # a cheap, often-right stage below pays
    useless = Level(0.0, 0.5, 3)  # never right and not free: it slows the stage above down
    assert chain_gain([top, useless]) < chain_gain([top])
    # priced verification (a CPU): the same chain gains less
    assert chain_gain([Level(0.8, 0.5, 4, v=1.6), low]) < chain_gain([top, low])
