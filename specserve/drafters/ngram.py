"""A Katz back-off trigram drafter (ngram/katz.py): each draft token is the n-gram model's most likely
continuation of the two tokens before it. No neural network and no KV cache: a draft token costs a
binary search or two (tens of microseconds in Python), so its drafts are free in the cost model's
eyes, verified where their confidence pays for their rows (and on steps where model drafting does not
pay, like prompt lookup's). Deterministic drafts (q = one-hot), so lossless under sampling as well.

The n-gram's probability is a poor estimate of the target's acceptance (it models the stdlib's source,
not the target's text), so the confidence a draft token carries is the acceptance measured for tokens
of its probability band: a prior of the band's middle, then what was verified (decayed)."""
from __future__ import annotations

import os
from typing import Optional

from ..ngram.katz import KatzModel
from ..types import Draft, Request, TokenOrigin
from .base import Drafter, DrafterContext, Proposal

BANDS = (0.1, 0.3, 0.5, 0.7, 0.9)  # n-gram probability band edges; 6 bands
PRIOR_WEIGHT = 10.0  # each band's prior (its middle) counts as this many verified tokens
DECAY = 0.998  # per verified token: the counts follow what is being served now
CACHE_SIZE = 1 << 16  # (u, v) contexts whose best continuation is kept


def build(spec, ctx: DrafterContext) -> Drafter:
    from ..loading.paths import cache_dir
    from ..training.ngram import build_ngram, default_path, load_for
    path = spec.ngram_model
    if path is None:
        path = default_path(cache_dir(), ctx.tokenizer)
        if path is None or not os.path.exists(path):
            from tqdm.auto import tqdm
            model = build_ngram(ctx.tokenizer, progress=tqdm)
            if path is not None:
                model.save(path)
            return NgramDrafter(model)
    return NgramDrafter(load_for(path, ctx.tokenizer))


def _band(p: float) -> int:
    return sum(p >= e for e in BANDS)


class NgramDrafter(Drafter):
    origin = TokenOrigin.NGRAM

    def __init__(self, model: KatzModel):
        self.model = model
        mids = [(lo + hi) / 2 for lo, hi in zip((0.0,) + BANDS, BANDS + (1.0,))]
        self.counts = [[PRIOR_WEIGHT * m, PRIOR_WEIGHT] for m in mids]  # per band: [accepted, tried] (decayed)
        self.proposed: dict[str, list[int]] = {}  # rid -> the probability bands of its latest draft's tokens
        self._best: dict[tuple[int, ...], tuple[int, float]] = {}

    def confidence(self, band: int) -> float:
        acc, tried = self.counts[band]
        return acc / tried

    def _next(self, context: list[int]) -> tuple[int, float]:
        key = tuple(context[-2:])
        hit = self._best.get(key)
        if hit is None:
            if len(self._best) >= CACHE_SIZE:
                self._best.clear()
            hit = self._best[key] = self.model.top(list(key), 1)[0]
        return hit

    def propose(self, requests: list[Request], max_len: int, min_confidence: Optional[float] = None,
                tree=None) -> Proposal:
        drafts = []
        for r in requests:
            context, tokens, conf, bands, cum = r.all_token_ids[-2:], [], [], [], 1.0
            for _ in range(max_len):
                t, p = self._next(context)
                band = _band(p)
                c = self.confidence(band)
                if min_confidence is not None and cum * c < min_confidence:
                    break
                cum *= c
                tokens.append(t)
                conf.append(c)
                bands.append(band)
                context = [context[-1], t] if context else [t]
            drafts.append(Draft(tokens, None, conf, origin=TokenOrigin.NGRAM))
            if tokens:
                self.proposed[r.request_id] = bands
        return Proposal(drafts)

    def propose_free(self, requests: list[Request], max_len: int) -> Optional[Proposal]:
        return self.propose(requests, max_len)

    def on_verified(self, request: Request, draft: Draft, accepted: int) -> None:
        """Count, per band, the tokens of this request's draft that were tried (every accepted one and
        the first rejected) and accepted."""
        bands = self.proposed.pop(request.request_id, None)
        if bands is None or draft.origin != TokenOrigin.NGRAM:
            return
        tried, acc = len(draft.tokens), accepted
        for j, band in enumerate(bands[:min(acc + 1, tried)]):
            c = self.counts[band]
            c[0], c[1] = DECAY * c[0] + (j < acc), DECAY * c[1] + 1.0

    def release(self, request: Request) -> None:
        self.proposed.pop(request.request_id, None)
