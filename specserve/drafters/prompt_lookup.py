"""Prompt lookup (Saxena 2023): draft by copying what followed the last occurrence of the sequence's
most recent n-gram in its own prompt and output. No model; the draft probability is taken as 1
(q = one-hot), which rejection sampling handles exactly, so it stays lossless."""
from __future__ import annotations

from typing import Optional

from ..types import Request
from .base import Draft, Drafter


# How often a looked-up token is accepted once the ones before it were (HumanEval, the embedded model,
# greedy, lookup+draft: 0.85 over 1,288 tokens): the confidence reported for every lookup token, since
# a copy has no probability of its own.
LOOKUP_CONFIDENCE = 0.85


class PromptLookupDrafter(Drafter):
    def __init__(self, max_ngram: int = 4, min_ngram: int = 1, confidence: float = LOOKUP_CONFIDENCE):
        self.max_ngram, self.min_ngram, self.confidence = max_ngram, min_ngram, confidence

    def propose(self, requests: list[Request], max_len: int, min_confidence: Optional[float] = None) -> list[Draft]:
        return [Draft(tokens, None, [self.confidence] * len(tokens))
                for tokens in (self._lookup(r.all_token_ids, max_len) for r in requests)]

    def _lookup(self, ids: list[int], k: int) -> list[int]:
        n_ids = len(ids)
        for n in range(min(self.max_ngram, n_ids - 1), self.min_ngram - 1, -1):
            tail = ids[n_ids - n:]
            # The most recent earlier match wins (closest context); scan backwards.
            for start in range(n_ids - n - 1, -1, -1):
                if ids[start:start + n] == tail:
                    follow = ids[start + n:start + n + k]
                    if follow:
                        return follow
        return []
