"""Prompt lookup (Saxena 2023): draft by copying what followed the last occurrence of the sequence's
most recent n-gram in its own prompt and output. No model; the draft probability is taken as 1
(q = one-hot), which rejection sampling handles exactly, so it stays lossless."""
from __future__ import annotations

from typing import Optional

from ..types import Draft, Request
from .base import Drafter, DrafterContext, Proposal

# How often a looked-up token is accepted, by the length of the n-gram that matched: (the first token,
# each later one given the ones before it were). A copy has no probability of its own, so these measured
# rates are its confidence, which the engine weighs against what a verify row costs. Measured on
# HumanEval 0-39 with the embedded model, greedy, lookup alone, fixed k = 6 (2,939 first tokens):
# a 1-gram match is right a quarter of the time, a 4-gram one 94%.
LOOKUP_CONFIDENCE = {1: (0.25, 0.65), 2: (0.45, 0.72), 3: (0.73, 0.85), 4: (0.94, 0.94)}


def lookup_confidence(ngram: int, num_tokens: int) -> list[float]:
    first, rest = LOOKUP_CONFIDENCE[min(ngram, max(LOOKUP_CONFIDENCE))]
    return [first] + [rest] * (num_tokens - 1)


def build(spec, ctx: DrafterContext) -> Drafter:
    return PromptLookupDrafter(spec.lookup_max_ngram)


class PromptLookupDrafter(Drafter):
    def __init__(self, max_ngram: int = 4, min_ngram: int = 1):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, requests: list[Request], max_len: int, min_confidence: Optional[float] = None,
                tree=None) -> Proposal:
        drafts = []
        for r in requests:
            tokens, ngram = self._lookup(r.all_token_ids, max_len)
            drafts.append(Draft(tokens, None, lookup_confidence(ngram, len(tokens)) if tokens else []))
        return Proposal(drafts)

    def propose_free(self, requests: list[Request], max_len: int) -> Optional[Proposal]:
        return self.propose(requests, max_len)

    def _lookup(self, ids: list[int], k: int) -> tuple[list[int], int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest matching tail
        n-gram, and n."""
        n_ids = len(ids)
        for n in range(min(self.max_ngram, n_ids - 1), self.min_ngram - 1, -1):
            tail = ids[n_ids - n:]
            # The most recent earlier match wins (closest context); scan backwards.
            for start in range(n_ids - n - 1, -1, -1):
                if ids[start:start + n] == tail:
                    follow = ids[start + n:start + n + k]
                    if follow:
                        return follow, n
        return [], 0
