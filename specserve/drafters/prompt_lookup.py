"""Prompt lookup (Saxena 2023): draft by copying what followed the last occurrence of the sequence's
most recent n-gram in its own prompt and output. No model; the draft probability is taken as 1
(q = one-hot), which rejection sampling handles exactly, so it stays lossless."""
from __future__ import annotations

from typing import Optional

from ..types import Draft, Request, TokenOrigin
from .base import Drafter, DrafterContext, Proposal

# How often a looked-up token is accepted, by the length of the n-gram that matched: (the first token,
# each later one given the ones before it were). A copy has no probability of its own, so these rates
# are its confidence, which the engine weighs against what a verify row costs (measured on HumanEval:
# docs/decisions.md#lookup-confidence). They are the prior only: beyond code copies are right far less
# often, so the drafter keeps counting what its copies got accepted, over all requests (decayed) and
# per request, and drafts with that.
LOOKUP_CONFIDENCE = {1: (0.25, 0.65), 2: (0.45, 0.72), 3: (0.73, 0.85), 4: (0.94, 0.94)}
PRIOR_WEIGHT = 20.0  # the constants count as this many observations in the global estimate
REQUEST_WEIGHT = 8.0  # the global estimate counts as this many in a request's own
DECAY = 0.995  # per verified lookup draft: the global counts follow what is being served now


def build(spec, ctx: DrafterContext) -> Drafter:
    return PromptLookupDrafter(spec.lookup_max_ngram)


class PromptLookupDrafter(Drafter):
    origin = TokenOrigin.LOOKUP

    def __init__(self, max_ngram: int = 4, min_ngram: int = 1):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        # per n-gram length: [first accepted, first tried, later accepted, later tried] (decayed)
        self.counts = {n: [0.0, 0.0, 0.0, 0.0] for n in LOOKUP_CONFIDENCE}
        self.own: dict[str, dict[int, list[float]]] = {}  # the same per request
        self.proposed: dict[str, int] = {}  # rid -> the n-gram its latest copy matched
        self.index: dict[str, NgramIndex] = {}  # rid -> where its n-grams last occurred

    def confidence(self, ngram: int, num_tokens: int, rid: Optional[str] = None) -> list[float]:
        """Estimated acceptance of each of a copy's tokens: the measured rates for its n-gram length,
        from the prior, everything verified since, and the request's own copies."""
        n = min(ngram, max(LOOKUP_CONFIDENCE))
        rates = []
        for i, prior in enumerate(LOOKUP_CONFIDENCE[n]):
            acc, tried = self.counts[n][2 * i], self.counts[n][2 * i + 1]
            rate = (PRIOR_WEIGHT * prior + acc) / (PRIOR_WEIGHT + tried)
            own = self.own.get(rid, {}).get(n)
            if own is not None:
                rate = (REQUEST_WEIGHT * rate + own[2 * i]) / (REQUEST_WEIGHT + own[2 * i + 1])
            rates.append(rate)
        return [rates[0]] + [rates[1]] * (num_tokens - 1)

    def propose(self, requests: list[Request], max_len: int, min_confidence: Optional[float] = None,
                tree=None) -> Proposal:
        drafts = []
        for r in requests:
            index = self.index.get(r.request_id)
            if index is None:
                index = self.index[r.request_id] = NgramIndex(self.min_ngram, self.max_ngram)
            tokens, ngram = index.lookup(r.all_token_ids, max_len)
            drafts.append(Draft(tokens, None, self.confidence(ngram, len(tokens), r.request_id) if tokens else [],
                                origin=TokenOrigin.LOOKUP))
            if tokens:
                self.proposed[r.request_id] = ngram
        return Proposal(drafts)

    def propose_free(self, requests: list[Request], max_len: int) -> Optional[Proposal]:
        return self.propose(requests, max_len)

    def on_verified(self, request: Request, draft: Draft, accepted: int) -> None:
        """Count what this request's copy got accepted (as verified: after the selection's cut)."""
        got = self.proposed.pop(request.request_id, None)
        if got is None or draft.origin != TokenOrigin.LOOKUP:
            return  # not a copy of ours
        n, tried, acc = min(got, max(LOOKUP_CONFIDENCE)), len(draft.tokens), accepted
        if tried == 0:
            return
        update = [float(acc >= 1), 1.0, float(max(0, min(acc, tried) - 1)), float(min(acc, tried - 1))]
        self.counts[n] = [DECAY * c + u for c, u in zip(self.counts[n], update)]
        own = self.own.setdefault(request.request_id, {}).setdefault(n, [0.0, 0.0, 0.0, 0.0])
        for i, u in enumerate(update):
            own[i] += u

    def release(self, request: Request) -> None:
        self.own.pop(request.request_id, None)
        self.proposed.pop(request.request_id, None)
        self.index.pop(request.request_id, None)


def lookup_scan(ids: list[int], k: int, min_ngram: int, max_ngram: int) -> tuple[list[int], int]:
    """The reference lookup: up to k tokens that followed the latest earlier occurrence of the longest
    matching tail n-gram, and n (a backward scan over the whole sequence; NgramIndex answers the same)."""
    n_ids = len(ids)
    for n in range(min(max_ngram, n_ids - 1), min_ngram - 1, -1):
        tail = ids[n_ids - n:]
        # The most recent earlier match wins (closest context); scan backwards.
        for start in range(n_ids - n - 1, -1, -1):
            if ids[start:start + n] == tail:
                follow = ids[start + n:start + n + k]
                if follow:
                    return follow, n
    return [], 0


class NgramIndex:
    """One sequence's n-grams (min_ngram..max_ngram tokens) -> where each last started, among those
    followed by a token: `lookup_scan`'s answer without scanning. A sequence only grows (drafts never
    enter its tokens), so each lookup indexes just the tokens added since the last: the backward scan
    cost a few percent of a plain step at batch 16 (docs/decisions.md#lookup-confidence)."""

    def __init__(self, min_ngram: int, max_ngram: int):
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.last: dict[tuple[int, ...], int] = {}
        self.done = 0  # n-grams ending before this position are indexed

    def lookup(self, ids: list[int], k: int) -> tuple[list[int], int]:
        n_ids = len(ids)
        if n_ids < self.done:  # not the sequence indexed (cannot happen in the engine): start again
            self.last, self.done = {}, 0
        # index the n-grams that end before the last token (so each has a follower)
        for end in range(self.done, n_ids - 1):
            for n in range(self.min_ngram, min(self.max_ngram, end + 1) + 1):
                self.last[tuple(ids[end + 1 - n:end + 1])] = end + 1 - n
        self.done = max(self.done, n_ids - 1)
        for n in range(min(self.max_ngram, n_ids - 1), self.min_ngram - 1, -1):
            start = self.last.get(tuple(ids[n_ids - n:]))
            if start is not None:
                return ids[start + n:start + n + k], n
        return [], 0
