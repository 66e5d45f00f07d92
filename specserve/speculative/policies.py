"""Draft-length policies: asked before each step how long the drafts may be, told after it how many
tokens each sequence drafted and had accepted. Plain Python. Each is named in
`specserve.registry.POLICIES`, which points at its `make(draft_len)`: draft_len "auto" keeps the
policy's default (fixed 4, BASS l0 = 7, threshold limit 8); an integer K is fixed's k, BASS's l0,
threshold's limit."""
from __future__ import annotations

import math
from typing import Optional, Union

from ..registry import POLICIES


class DraftLengthPolicy:
    min_confidence: Optional[float] = None  # threshold decoding: stop a draft below this cumulative probability

    def draft_len(self) -> int:
        raise NotImplementedError

    def update(self, drafted: list[int], accepted: list[int], confidences: list[list[float]]) -> None:
        pass

    @classmethod
    def make(cls, draft_len: Union[str, int] = "auto") -> "DraftLengthPolicy":
        return cls() if draft_len == "auto" else cls(int(draft_len))


class FixedPolicy(DraftLengthPolicy):
    def __init__(self, k: int = 4):
        self.k = k

    def draft_len(self) -> int:
        return self.k


class BassPolicy(DraftLengthPolicy):
    """BASS (Qian et al. 2024) Algorithm 1: grow the draft length by l_incre while some sequence accepts
    all of it; otherwise shrink by ceil(l / l_mod) (+1 on consecutive shrinks), never below the longest
    accepted run of the step."""

    def __init__(self, l0: int = 7, l_incre: int = 2, l_mod: int = 10, l_limit: int = 32):  # make(K): l0 = K
        self.l, self.l_incre, self.l_mod, self.l_limit = l0, l_incre, l_mod, l_limit
        self.s = 0

    def draft_len(self) -> int:
        return self.l

    def update(self, drafted: list[int], accepted: list[int], confidences=None) -> None:
        if not accepted:
            return
        if max(accepted) == self.l:
            self.l = min(self.l + self.l_incre, self.l_limit)
            self.s = 0
        else:
            self.l = self.l - math.ceil(self.l / self.l_mod) - self.s
            self.l = max(1, *accepted, self.l)
            self.s = 1


class ThresholdPolicy(DraftLengthPolicy):
    """Draft while the cumulative draft probability stays above a threshold; after each step move the
    threshold toward the cumulative probability at the last accepted position (lower it a little when a
    whole draft was accepted), clamped to [0.05, 0.95]."""

    def __init__(self, limit: int = 8, threshold: float = 0.5, rate: float = 0.5, step_down: float = 0.05):  # make(K): limit
        self.limit, self.min_confidence, self.rate, self.step_down = limit, threshold, rate, step_down

    def draft_len(self) -> int:
        return self.limit

    def update(self, drafted: list[int], accepted: list[int], confidences: list[list[float]]) -> None:
        targets = []
        for n, a, conf in zip(drafted, accepted, confidences):
            if n == 0:
                continue
            if a == n:
                targets.append(self.min_confidence - self.step_down)
            else:
                targets.append(math.prod(conf[:a]))  # cumulative probability of the accepted prefix
        if targets:
            goal = sum(targets) / len(targets)
            self.min_confidence = min(0.95, max(0.05, self.min_confidence + self.rate * (goal - self.min_confidence)))


def make_policy(name: str, draft_len: Union[str, int] = "auto") -> DraftLengthPolicy:
    return POLICIES.get(name)(draft_len)
