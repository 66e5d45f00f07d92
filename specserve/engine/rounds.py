"""The engine's side of cuda/rounds.py: when every running request is a plain greedy decode, run M
rounds on the GPU with one host sync, then settle the scheduler's, the drafter's and the requests'
state as M ordinary steps would have left them.

Taken only where the rounds give what the ordinary steps give: no request waiting or still in its
prompt, all greedy, none guided, biased, asking for log-probabilities or refusing speculation, the
EAGLE drafter caught up to at most 1 + K features per request, and KV room for M (1 + K) more
positions in both caches. Anything else goes through the ordinary step, which this never changes.
"""
from __future__ import annotations

import sys
import time
from typing import Optional

import torch

from ..cuda.rounds import DeviceRounds, RoundsInput
from ..types import Request, TokenOrigin

# K of EAGLE's rounds for draft_len "auto": 2 was the fastest of 1-4 at batch 1 and 8 on an H100
# (SmolLM2-135M's EAGLE head, 16 rounds a sync; docs/decisions.md#device-rounds)
AUTO_DRAFT_LEN = 2


def build(runner, speculator, max_rounds: int, config) -> Optional[DeviceRounds]:
    """The rounds over the graph runner: regular decoding's, or EAGLE's where it drafts greedy chains
    as graphs (K: the configured draft length; "auto": AUTO_DRAFT_LEN); None for other drafters."""
    sc = config.scheduler
    if speculator is None:
        return DeviceRounds(runner, None, max_rounds=max_rounds, max_seqs=sc.max_num_seqs)
    g = getattr(speculator.drafter, "chain_graphs", None)
    if g is None:
        print("cuda_rounds: only regular decoding and EAGLE run in rounds; steps run one by one", file=sys.stderr)
        return None
    k = config.speculative.draft_len
    return DeviceRounds(runner, g, draft_len=AUTO_DRAFT_LEN if k == "auto" else k, max_rounds=max_rounds, max_seqs=sc.max_num_seqs)


def eligible(engine, rounds: DeviceRounds) -> Optional[list[Request]]:
    sched = engine.scheduler
    running = sched.running
    if sched.waiting or not running or engine._siblings or len(running) > rounds.max_seqs:
        return None
    for r in running:
        p = r.params
        if (not r.past_prompt or r.num_computed_tokens != r.num_tokens - 1 or not p.greedy or p.logit_bias
                or p.needs_logprobs or p.speculative is False or engine._guide(r) is not None):
            return None
    if rounds.g is not None:
        d = rounds.g.drafter
        for r in running:
            c = d.num_pending.get(r.request_id, 0)
            if not d._ready(r) or not 1 <= c <= rounds.R:
                return None
    return list(running)


def num_rounds(engine, rounds: DeviceRounds, reqs: list[Request]) -> int:
    """M: as many as the longest request still needs at R tokens a round (fewer past nobody's end),
    within the buffers and max_model_len."""
    R = rounds.R
    left = max(r.params.max_tokens - len(r.output_token_ids) for r in reqs)
    m = min(rounds.M, max(1, -(-left // R)))
    room = min(engine.max_model_len - r.num_tokens for r in reqs)
    return min(m, room // R)


def step(engine, rounds: DeviceRounds) -> Optional[list[tuple[Request, str]]]:
    """One rounds step, or None where the ordinary step must run."""
    reqs = eligible(engine, rounds)
    if reqs is None:
        return None
    M = num_rounds(engine, rounds, reqs)
    if M < 1:
        return None
    R, blocks = rounds.R, engine.scheduler.blocks
    bs = blocks.block_size
    end = [r.num_computed_tokens + M * R for r in reqs]  # positions < end get written
    need = sum(max(0, -(-e // bs) - len(r.block_table)) for r, e in zip(reqs, end))
    if need > blocks.num_free_blocks or not rounds.fits(len(reqs), max(-(-e // bs) for e in end), -(-max(end) // bs)):
        return None
    d = None if rounds.g is None else rounds.g.drafter
    if d is not None and not all(d.kv.reserve(r.request_id, e) for r, e in zip(reqs, end)):
        return None
    t0 = time.perf_counter()
    seqs = []
    for r, e in zip(reqs, end):
        blocks.allocate(r.block_table, e)
        L = r.num_computed_tokens
        s = RoundsInput(L, r.token_at(L), r.block_table)
        if d is not None:
            rid = r.request_id
            c = d.num_pending.pop(rid)
            s.draft_table, s.feats = d.kv.tables[rid], torch.cat(d.pending.pop(rid))
            s.feat_tokens = [r.token_at(t + 1) for t in range(L - c, L)]
        seqs.append(s)
    out = rounds.run(seqs, M)
    now = time.perf_counter()
    kv = engine.kv
    if kv.features is not None:  # beside the KV for prefix-cache hits, as the ordinary steps keep them
        slots = [r.block_table[p // bs] * bs + p % bs
                 for r, toks in zip(reqs, out.tokens) for p in range(r.num_computed_tokens, r.num_computed_tokens + len(toks))]
        kv.features.index_copy_(0, torch.tensor(slots, dtype=torch.long, device=kv.features.device),
                                rounds.accepted_hidden(out.counts).to(kv.features.dtype))
    for r, toks, feats in zip(reqs, out.tokens, out.feats):
        L = r.num_computed_tokens + len(toks)
        r.num_computed_tokens = L
        blocks.truncate(r.block_table, L)
        if d is not None:
            rid = r.request_id
            d.kv.num_done[rid] = L - len(feats)
            d.pending[rid] = [feats]
            d.num_pending[rid] = len(feats)
    results = []
    for r, toks, counts in zip(reqs, out.tokens, out.counts):
        origins = [o for k in counts for o in [TokenOrigin.DRAFT] * (k - 1) + [TokenOrigin.TARGET]]
        delta = ""
        for tok, origin in zip(toks, origins):
            delta += engine._append(r, tok, None, now, origin)
            if r.is_finished:
                break
        results.append((r, delta))
    engine.rounds_time += time.perf_counter() - t0
    return results
