"""The engine's side of cuda/rounds.py: while every running request is a plain greedy decode, runs of
M rounds go to the GPU, one host sync each, and the scheduler's, the drafter's and the requests' state
is settled as M ordinary steps would have left it.

Pipelined (vLLM's async scheduling): each step queues the next run of the same batch, from where the
last queued run leaves it on the device, before it waits for the oldest run and appends its tokens,
so the host's work per token (detokenising, stop checks) overlaps the GPU's next run instead of
idling it. A request that stops goes on as a row that writes nothing (its in-flight run may still
write the blocks it held: nothing takes them before the queue drains, and those writes land first).
The queue drains, and the ordinary step takes over, when a request arrives or nobody needs more.

Taken only where the rounds give what the ordinary steps give: no request waiting or still in its
prompt, all greedy, none guided, biased, asking for log-probabilities or refusing speculation, the
EAGLE drafter holding every target feature but the last (it feeds a new prompt's first), and KV room
for the rounds' positions in both caches. Anything else goes through the ordinary step, which this
never changes.
"""
from __future__ import annotations

import math
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Optional

import torch

from ..cuda.rounds import DeviceRounds, Flight, RoundsInput
from ..types import Request, TokenOrigin

# K of EAGLE's rounds for draft_len "auto": 2 was the fastest of 1-4 at batch 1 and 8 on an H100
# (SmolLM2-135M's EAGLE head, 16 rounds a sync; docs/decisions.md#device-rounds)
AUTO_DRAFT_LEN = 2
MEASURED_ROUNDS = 16  # rounds after which a run is sized by the tokens a round measured


def build(runner, speculator, max_rounds: int, config) -> Optional["RoundsDriver"]:
    """The rounds over the graph runner: regular decoding's, or EAGLE's where it drafts greedy chains
    as graphs (K: the configured draft length; "auto": AUTO_DRAFT_LEN; shape "tree": a tree of K
    levels of tree_beam nodes, each level from the tree_top_k children of the last); None for other
    drafters."""
    sc = config.scheduler
    if speculator is None:
        return RoundsDriver(DeviceRounds(runner, None, max_rounds=max_rounds, max_seqs=sc.max_num_seqs))
    g = getattr(speculator.drafter, "chain_graphs", None)
    if g is None:
        print("cuda_rounds: only regular decoding and EAGLE run in rounds; steps run one by one", file=sys.stderr)
        return None
    spec = config.speculative
    k = spec.draft_len
    tree = spec.shape == "tree"  # in rounds: K levels of tree_beam nodes (tree_max_nodes does not apply)
    return RoundsDriver(DeviceRounds(runner, g, draft_len=AUTO_DRAFT_LEN if k == "auto" else k,
                                     max_rounds=max_rounds, max_seqs=sc.max_num_seqs,
                                     beam=spec.tree_beam if tree else 1, top_k=spec.tree_top_k if tree else 1))


@dataclass
class _Queued:
    flight: Flight
    end: list[int]  # per request: positions < end reserved (target and draft KV) when it was queued


class RoundsDriver:
    def __init__(self, device_rounds: DeviceRounds):
        self.dev = device_rounds
        self.queue: deque[_Queued] = deque()
        self.reqs: list[Request] = []  # the batch the queued runs compute, fixed while any is queued
        self.time = 0.0  # seconds in rounds steps

    def stats(self) -> dict:
        """Rounds on the device since the engine started (or the last reset): per live sequence."""
        d = self.dev
        return {"rounds": d.rounds, "drafted": d.drafted, "accepted": d.accepted,
                "tokens_per_round": (d.rounds + d.accepted) / d.rounds if d.rounds else None, "seconds": self.time}

    def reset_stats(self) -> None:
        self.dev.rounds = self.dev.drafted = self.dev.accepted = 0
        self.dev.by_batch.clear()
        self.time = 0.0

    @property
    def drafter(self):
        return None if self.dev.g is None else self.dev.g.drafter

    def step(self, engine) -> Optional[list[tuple[Request, str]]]:
        """One rounds step (the new tokens of one run), or None where the ordinary step must run."""
        t0 = time.perf_counter()
        if not self.queue and not self._start(engine):
            return None
        self._queue_next(engine)
        out = self._settle(engine)
        self.time += time.perf_counter() - t0
        return out

    # --- what may run ---------------------------------------------------------------------------
    def _eligible(self, engine) -> Optional[list[Request]]:
        sched = engine.scheduler
        running = sched.running
        if sched.waiting or not running or engine._siblings or len(running) > self.dev.max_seqs:
            return None
        for r in running:
            p = r.params
            if (not r.past_prompt or r.num_computed_tokens != r.num_tokens - 1 or not p.greedy or p.speculative is False
                    or p.logit_bias or p.penalized or p.min_tokens or p.allowed_token_ids is not None or p.bad_words
                    or p.needs_logprobs or engine._guide(r) is not None):
                return None
        d = self.drafter
        if d is not None and not all(d._ready(r) and d.num_pending.get(r.request_id, 0) >= 1 for r in running):
            return None
        return list(running)

    def _num_rounds(self, engine, reqs: list[Request], start: list[int], queued: int) -> int:
        """Rounds for the next run: as many as the request with the most tokens left still needs at the
        tokens a round measured so far, beyond the `queued` rounds already on their way (counted at the
        same rate), within M and max_model_len (start: each request's first KV row the run may write).
        0 where the queued rounds should finish every request: if they fall short, the next step
        launches a run from the host's state. (Counting each round at R tokens made the last runs of a
        request a tail of small ones, each queued one counted at 1 token wasted rounds:
        docs/decisions.md#tree-rounds.)"""
        R, per = self.dev.R, self._per_round()
        left = max(r.params.max_tokens - len(r.output_token_ids) for r in reqs) - queued * per
        room = min(engine.max_model_len - 1 - s for s in start)
        return max(0, min(self.dev.M, math.ceil(left / per), room // R))

    def _per_round(self) -> float:
        """Tokens a live sequence gets per round: measured once there are some, else half a draft."""
        d = self.dev
        if d.rounds >= MEASURED_ROUNDS:
            return (d.rounds + d.accepted) / d.rounds
        return 1 + d.K / 2

    def _reserve(self, engine, reqs: list[Request], end: list[int]) -> bool:
        """Blocks for positions < end in both caches (all or none: a request whose table grew keeps it)."""
        blocks, bs, d = engine.scheduler.blocks, engine.scheduler.blocks.block_size, self.drafter
        need = sum(blocks.blocks_needed(r.block_table, e) for r, e in zip(reqs, end))
        if need > blocks.num_free_blocks or not self.dev.fits(len(reqs), max(-(-e // bs) for e in end),
                                                              -(-max(end) // d.kv.blocks.block_size) if d else 0):
            return False
        if d is not None and not all(d.kv.reserve(r.request_id, e) for r, e in zip(reqs, end)):
            return False
        for r, e in zip(reqs, end):
            blocks.allocate(r.block_table, e)
        return True

    # --- queueing -------------------------------------------------------------------------------
    def _start(self, engine) -> bool:
        reqs = self._eligible(engine)
        d = self.drafter
        # a request just past its prompt: the draft feeds the prompt's features now, so the rounds start
        # at once instead of after an ordinary speculative step (a round's catch-up takes at most R)
        if reqs is None or (d is not None and not d.feed_all_but(reqs, 1)):
            return False
        start = [r.num_computed_tokens + self.dev.scratch for r in reqs]  # a tree's rows past the rounds'
        M = self._num_rounds(engine, reqs, start, 0)
        end = [s + M * self.dev.R for s in start]
        if M < 1 or not self._reserve(engine, reqs, end):
            return False
        seqs = []
        for r in reqs:
            L = r.num_computed_tokens
            s = RoundsInput(L, r.token_at(L), r.block_table)
            if d is not None:
                rid = r.request_id
                c = d.num_pending.pop(rid)
                s.draft_table, s.feats = d.kv.tables[rid], torch.cat(d.pending.pop(rid))
                s.feat_tokens = [r.token_at(t + 1) for t in range(L - c, L)]
            seqs.append(s)
        self.reqs = reqs
        self.queue.append(_Queued(self.dev.launch(seqs, M), end))
        return True

    def _queue_next(self, engine) -> None:
        """Queue the run after the last one queued, unless a request is waiting or nobody needs it."""
        if len(self.queue) != 1 or engine.scheduler.waiting or engine._siblings:
            return
        last = self.queue[-1]
        live = [not r.is_finished for r in self.reqs]
        alive = [r for r, ok in zip(self.reqs, live) if ok]
        if not alive:
            return
        M = self._num_rounds(engine, alive, [e for e, ok in zip(last.end, live) if ok], last.flight.rounds)
        if M < 1:
            return
        end = [e + M * self.dev.R if ok else e for e, ok in zip(last.end, live)]
        if not self._reserve(engine, alive, [e for e, ok in zip(end, live) if ok]):
            return
        d = self.drafter
        draft_tables = [d.kv.tables.get(r.request_id, []) if ok else [] for r, ok in zip(self.reqs, live)] if d else None
        tables = [r.block_table if ok else [] for r, ok in zip(self.reqs, live)]
        self.queue.append(_Queued(self.dev.extend(last.flight, M, tables, draft_tables, live), end))

    # --- settling -------------------------------------------------------------------------------
    def _settle(self, engine) -> list[tuple[Request, str]]:
        """Wait for the oldest run, move every live request past its tokens (and, when it was the last
        run queued, hand the drafter its state back and free the blocks past the tokens), append them."""
        q = self.queue.popleft()
        out = self.dev.collect(q.flight)
        drained = not self.queue
        kv, blocks, d = engine.kv, engine.scheduler.blocks, self.drafter
        live = [not r.is_finished for r in self.reqs]
        if kv.features is not None:  # beside the KV for prefix-cache hits, as the ordinary steps keep them
            counts = [c if ok else [0] * len(c) for c, ok in zip(out.counts, live)]
            slots = [blocks.slot(r.block_table, p) for r, toks, ok in zip(self.reqs, out.tokens, live) if ok
                     for p in range(r.num_computed_tokens, r.num_computed_tokens + len(toks))]
            if slots:
                idx = torch.tensor(slots, dtype=torch.long, pin_memory=kv.features.is_cuda)
                kv.features.index_copy_(0, idx.to(kv.features.device, non_blocking=True),
                                        self.dev.accepted_hidden(q.flight, counts).to(kv.features.dtype))
        for b, (r, toks, ok) in enumerate(zip(self.reqs, out.tokens, live)):
            if not ok:
                continue
            r.num_computed_tokens += len(toks)
            if drained:
                blocks.truncate(r.block_table, r.num_computed_tokens)
                if d is not None:
                    c = out.counts[b][-1]
                    d.kv.num_done[r.request_id] = r.num_computed_tokens - c
                    d.pending[r.request_id] = [self.dev.pending_feats(b, c)]
                    d.num_pending[r.request_id] = c
        now = time.perf_counter()
        results = []
        for r, toks, counts, ok in zip(self.reqs, out.tokens, out.counts, live):
            if not ok:
                continue
            origins = [o for k in counts for o in [TokenOrigin.DRAFT] * (k - 1) + [TokenOrigin.TARGET]]
            delta = ""
            for tok, origin in zip(toks, origins):
                delta += engine._append(r, tok, None, now, origin)
                if r.is_finished:
                    break
            results.append((r, delta))
        if all(r.is_finished for r in self.reqs):  # a run queued for nobody: wait it out, leave nothing behind
            while self.queue:
                self.dev.collect(self.queue.popleft().flight)
            drained = True
        if drained:
            self.reqs = []
        return results
