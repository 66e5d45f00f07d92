"""Suffix drafting (SuffixDecoding, Oliaro et al. 2024): token trees drafted from what followed the
longest match of the sequence's latest tokens in its own prompt and output and in earlier requests'
outputs (ngram/suffix.py). No model: drafts are free, deterministic (q = one-hot) and so lossless
under sampling too; verified as trees (the target's tree attention) where they pay for their rows.

As in SuffixDecoding, a draft's length follows the match: at most `max_spec_factor` tokens per
matched token (a long match is strong evidence that the text repeats), and a branch only where at
least `min_prob` of the occurrences went that way. Earlier outputs are what agentic and repetitive
workloads (the same tool calls, templated answers, code edited in turn) share across requests; the
`max_cached` latest outputs are kept (FIFO).

The confidence of a node (what the engine weighs against the row it costs) is its share of the
occurrences, shrunk towards 1/2 for few occurrences: (count + 1) / (total + 2), times what verification
has measured of such shares: the first tokens of verified suffix drafts accepted over the shares they
were drafted with (decayed, a prior of 1 worth 10 drafts). On code an earlier occurrence is usually
followed again; in chat far less often than the shares promise, so the raw shares overpriced chat's
drafts (docs/decisions.md#suffix-confidence)."""
from __future__ import annotations

from collections import deque
from typing import Optional

from ..ngram.suffix import SuffixIndex
from ..types import Draft, Request, TokenOrigin
from .base import Drafter, DrafterContext, Proposal

MAX_SPEC_FACTOR = 1.0  # SuffixDecoding's default in vLLM: draft tokens per matched token
MIN_PROB = 0.1  # a branch needs this share of the occurrences
MAX_CACHED = 4096  # earlier outputs kept for other requests
PRIOR_WEIGHT, DECAY = 10.0, 0.995  # the calibration's prior (verified drafts' worth) and its decay per draft


def build(spec, ctx: DrafterContext) -> Drafter:
    return SuffixDrafter(max_nodes=spec.tree_max_nodes)


class SuffixDrafter(Drafter):
    origin = TokenOrigin.SUFFIX

    def __init__(self, max_nodes: int = 15, max_depth: int = 32, max_cached: int = MAX_CACHED):
        self.index = SuffixIndex(max_depth=max_depth)
        self.max_nodes, self.max_cached = max_nodes, max_cached
        self.cached: deque = deque()  # ids of earlier outputs in the index, oldest first
        self._next = 0
        self.calibration = [0.0, 0.0]  # decayed [first tokens accepted, the shares they were drafted with]
        self.proposed: dict[str, float] = {}  # rid -> its latest draft's first token's share

    @property
    def scale(self) -> float:
        """Accepted first tokens over the shares they were drafted with (1 before any verified)."""
        acc, promised = self.calibration
        return (PRIOR_WEIGHT + acc) / (PRIOR_WEIGHT + promised)

    def propose(self, requests: list[Request], max_len: int, min_confidence: Optional[float] = None,
                tree=None) -> Proposal:
        drafts = []
        for r in requests:
            sid = ("live", r.request_id)
            have = len(self.index.seqs.get(sid, ()))
            if have < r.num_tokens:
                self.index.extend(sid, [r.token_at(i) for i in range(have, r.num_tokens)])
            t = self.index.draft(self.index.seqs[sid], self.max_nodes, MAX_SPEC_FACTOR, MIN_PROB, max_depth=max_len)
            d = self._as_draft(t, min_confidence, self.scale)
            if d.tokens:  # the share of its likeliest first token, what the selection keeps first
                first = max(_share(p, n) for p, n, parent in zip(t.probs, t.support, t.parents) if parent < 0)
                self.proposed[r.request_id] = first
            drafts.append(d)
        return Proposal(drafts)

    def on_verified(self, request: Request, draft: Draft, accepted: int) -> None:
        """Count whether the first token of this request's suffix draft was accepted, against the share
        it was drafted with."""
        first = self.proposed.pop(request.request_id, None)
        if first is None or draft.origin != TokenOrigin.SUFFIX:
            return  # not a draft of ours
        if draft.tokens:
            acc, promised = self.calibration
            self.calibration = [DECAY * acc + (accepted >= 1), DECAY * promised + first]

    @staticmethod
    def _as_draft(t, min_confidence: Optional[float], scale: float = 1.0) -> Draft:
        conf = [min(0.99, scale * _share(p, n)) for p, n in zip(t.probs, t.support)]
        chain = all(p == i - 1 for i, p in enumerate(t.parents))
        d = Draft(t.tokens, None, conf, None if chain else list(t.parents), TokenOrigin.SUFFIX)
        if min_confidence is not None and d.tokens:
            d = d.subset([j for j, c in enumerate(d.cumulative()) if c >= min_confidence])
        return d

    def propose_free(self, requests: list[Request], max_len: int) -> Optional[Proposal]:
        return self.propose(requests, max_len)

    def release(self, request: Request) -> None:
        """A finished (or preempted) request: its output joins the earlier outputs other requests match."""
        self.proposed.pop(request.request_id, None)
        seq = self.index.seqs.get(("live", request.request_id))
        self.index.remove(("live", request.request_id))
        if request.is_finished and request.output_token_ids and seq is not None:
            sid = ("done", self._next)
            self._next += 1
            self.index.extend(sid, list(request.output_token_ids))
            self.cached.append(sid)
            while len(self.cached) > self.max_cached:
                self.index.remove(self.cached.popleft())


def _share(prob: float, support: int) -> float:
    """A node's share of the occurrences, shrunk towards 1/2 for few: (count + 1) / (total + 2)."""
    return (prob * support + 1) / (support + 2)
