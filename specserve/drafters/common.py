"""What model-based drafters share: their own paged KV cache (one block table per request, rolled back
by simply not counting rejected rows) and picking draft tokens from draft logits."""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import torch

from ..attention.paged import AttentionMetadata
from ..kv.block_manager import BlockManager
from ..kv.cache import KVCache
from ..sampling.penalties import PenaltySpan, apply_penalties
from ..sampling.sampler import draw, make_generator, warp_logits
from ..types import Request
from .base import Draft


class DraftKV:
    """The drafter's KV cache. `num_done[rid]` rows are valid; rows past it (speculative ones) are
    overwritten by the next step, so rolling back is just not advancing `num_done`."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        self.blocks = BlockManager(num_blocks, block_size)
        self.cache = KVCache(num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype, device)
        self.tables: dict[str, list[int]] = {}
        self.num_done: dict[str, int] = {}
        self.device = device

    def reserve(self, rid: str, num_tokens: int) -> bool:
        """Make room for positions < num_tokens; False when the draft cache is full (no draft then)."""
        table = self.tables.setdefault(rid, [])
        self.num_done.setdefault(rid, 0)
        if not self.blocks.can_allocate(table, num_tokens):
            return False
        self.blocks.allocate(table, num_tokens)
        return True

    def metadata(self, rids: list[str], q_lens: list[int], kv_lens: list[int], mode: str = "split",
                 span_parents=None) -> AttentionMetadata:
        return AttentionMetadata.build(q_lens, kv_lens, [self.tables[r] for r in rids], self.blocks.block_size,
                                       self.device, mode=mode, span_parents=span_parents)

    def release(self, rid: str) -> None:
        table = self.tables.pop(rid, None)
        if table is not None:
            self.blocks.free(table)
        self.num_done.pop(rid, None)


class DraftPicker:
    """Draft tokens from draft logits: argmax for greedy requests; for sampled ones a draw from q (the
    request's warping applied to the draft logits) with a per-request draft generator, so seeded runs
    repeat. `vocab_ids` maps a reduced draft vocabulary back to target ids."""

    def __init__(self, target_vocab: int, device: torch.device, vocab_ids: Optional[torch.Tensor] = None):
        self.target_vocab, self.device, self.vocab_ids = target_vocab, device, vocab_ids
        self.vocab_list = None if vocab_ids is None else vocab_ids.tolist()  # draft id -> target id
        self.draft_column: Optional[np.ndarray] = None  # target id -> draft id (-1: none), made on first use
        self.generators: dict[str, torch.Generator] = {}

    def pick(self, requests: list[Request], logits: torch.Tensor, drafted: Optional[list[list[int]]] = None):
        """logits [B, V_draft], drafted [B] (each request's draft tokens before these rows) -> (token ids
        [B], q rows [B, V_target] or None per request, confidence [B])."""
        if any(r.params.penalized for r in requests):
            logits = self.penalise(requests, logits.float().clone(), drafted or [[] for _ in requests])
        probs = torch.softmax(logits.float(), dim=-1)
        tokens, qs, conf = [], [], []
        top_p, top = probs.max(-1)
        best, best_p = top.tolist(), top_p.tolist()
        for i, r in enumerate(requests):
            if r.params.greedy:
                tok, q, c = best[i], None, best_p[i]
            else:
                q_sub = warp_logits(logits[i:i + 1].float(), r.params)[0]
                tok = draw(q_sub, self.generator(r))
                c = float(q_sub[tok])
                q = q_sub if self.vocab_ids is None else \
                    torch.zeros(self.target_vocab, device=q_sub.device).index_copy_(0, self.vocab_ids, q_sub)
            tokens.append(tok if self.vocab_list is None else self.vocab_list[tok])
            qs.append(q)
            conf.append(c)
        return tokens, qs, conf

    def penalise(self, requests: list[Request], logits: torch.Tensor, drafted: list[list[int]]) -> torch.Tensor:
        """The requests' penalties on the draft logits too, each row's draft tokens so far counted as
        output, so the draft proposes from the distribution the target's rows will hold
        (docs/decisions.md#penalised-drafts). Chains drawn here only: token trees and the CUDA EAGLE
        rounds draft unpenalised. Verification does not depend on it: drafts are checked against the
        target's own penalised rows."""
        spans = []
        for i, (r, d) in enumerate(zip(requests, drafted)):
            if r.params.penalized:
                spans.append(PenaltySpan(i, r.params, self.draft_ids(r.prompt_token_ids), self.draft_ids(r.output_token_ids + d)))
        apply_penalties(logits, spans)
        return logits

    def draft_ids(self, tokens: list[int]) -> list[int]:
        """Target ids -> the draft vocabulary's columns (tokens outside it dropped)."""
        if self.vocab_ids is None:
            return tokens
        if self.draft_column is None:
            self.draft_column = np.full(self.target_vocab, -1, dtype=np.int64)
            self.draft_column[self.vocab_ids.cpu().numpy()] = np.arange(len(self.vocab_ids))
        cols = self.draft_column[np.asarray(tokens, dtype=np.int64)]
        return cols[cols >= 0].tolist()

    def generator(self, r: Request) -> torch.Generator:
        """The request's draft generator (seeded from its seed, so that seeded runs repeat)."""
        g = self.generators.get(r.request_id)
        if g is None:
            g = self.generators[r.request_id] = make_generator(None if r.seed is None else r.seed + 7919, self.device)
        return g

    def release(self, rid: str) -> None:
        self.generators.pop(rid, None)


def autoregressive_drafts(live: list[Request], max_len: int, min_confidence: Optional[float], picker: DraftPicker,
                          logits: torch.Tensor, advance: Callable) -> dict[str, Draft]:
    """The drafting loop of model-based drafters: pick a token per request from `logits` [B, V_draft],
    record it (and q, and its probability), stop a request once its cumulative draft probability falls
    below min_confidence, and ask `advance(rows, tokens, requests, j)` for the next logits of the requests
    still drafting (rows index the previous call's batch)."""
    drafts = {r.request_id: Draft() for r in live}
    cum = [1.0] * len(live)
    active = list(range(len(live)))
    for j in range(max_len):
        tokens, qs, conf = picker.pick([live[i] for i in active], logits, [drafts[live[i].request_id].tokens for i in active])
        still = []
        for row, (i, tok, q, c) in enumerate(zip(active, tokens, qs, conf)):
            d = drafts[live[i].request_id]
            d.tokens.append(tok)
            d.confidence.append(c)
            if q is not None:
                d.probs = q[None] if d.probs is None else torch.cat([d.probs, q[None]])
            cum[i] *= c
            if min_confidence is None or cum[i] >= min_confidence:
                still.append(row)
        if j == max_len - 1 or not still:
            break
        active = [active[s] for s in still]
        logits = advance(still, [tokens[s] for s in still], [live[i] for i in active], j)
    return drafts
