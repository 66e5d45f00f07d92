"""Verification for seeded sampled requests: draw the target's own token at each position, with the
request's generator, and follow the draft while it matches ("sample and compare").

Why not rejection sampling (rejection.py, tree.py) for them: there, how many uniforms a step takes and
what each one decides depend on the draft, and drafters learn across requests (suffix drafting's
index of earlier outputs, the acceptance rates every drafter calibrates its confidences with, the
automatic choice's measured alpha), so the same seeded request drew other numbers once other
requests had run. Here the request's generator gives exactly one uniform per emitted token, drawn
from the target's warped distribution by the same inverse-CDF draw as a plain decoding step
(sampler.draw): the output is the one regular decoding gives with that seed, whatever was drafted,
by whichever method, whatever ran before or beside it.

Lossless: every emitted token is a draw from the target's distribution given the tokens before it.
For deterministic drafts (prompt lookup, n-grams, suffix drafting, lookahead, token trees of top-k
children) the chance of accepting a draft token x is p(x), as in rejection sampling with q one-hot,
so nothing is lost. For a draft model's sampled drafts it is p(x) rather than min(1, p(x) / q(x)):
seeded requests accept fewer of those (unseeded requests keep rejection sampling).
"""
from __future__ import annotations

import torch

from ..types import Draft, SamplingParams
from .sampler import draw, warp_logits


def verify_by_sampling(logits: torch.Tensor, draft: Draft, params: SamplingParams, generator: torch.Generator
                       ) -> tuple[list[int], int]:
    """logits [1 + n, vocab] of one request's verify span (row 0: after the last known token, row j + 1:
    after draft token j's path), its draft (a chain or a tree) -> (the accepted draft indices, root
    first; the next token, drawn from the target where the draft stops matching or ends)."""
    children: dict[int, list[int]] = {}
    for j, p in enumerate(draft.parent_list()):
        children.setdefault(p, []).append(j)
    path: list[int] = []
    node = -1  # the root: the last known token
    while True:
        token = draw(warp_logits(logits[node + 1:node + 2], params)[0], generator)
        match = next((j for j in children.get(node, ()) if draft.tokens[j] == token), None)
        if match is None:
            return path, token
        path.append(match)
        node = match
