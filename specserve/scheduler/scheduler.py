"""Continuous batching: each step, decide how many new tokens every request brings.

Running requests go first (a decode token, or the next prefill chunk), then waiting ones are
admitted while the token budget, the sequence limit and free KV blocks allow. A prompt longer than
the budget is prefilled in chunks. A request with draft tokens brings them too (1 + k tokens to
verify); rolling rejected ones back is the engine moving num_computed_tokens back. When blocks run out, the newest running request is preempted:
its blocks are freed and it is recomputed later (its generated tokens are kept). Plain Python.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ..kv.block_manager import BlockManager
from ..types import Request, RequestStatus


@dataclass
class ScheduledRequest:
    request: Request
    num_new_tokens: int  # tokens whose KV this step computes, starting at request.num_computed_tokens

    @property
    def samples(self) -> bool:
        """Whether this step reaches the request's last known token (and its drafts, if any), so its
        logits pick the next token(s)."""
        r = self.request
        return r.num_computed_tokens + self.num_new_tokens == r.num_tokens + len(r.draft_token_ids)


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int):
        self.blocks = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, request: Request) -> None:
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        kept: list[Request] = []
        queue = list(self.running)
        while queue and budget > 0:
            req = queue.pop(0)
            # Draft tokens are just more tokens to compute; a budget too small for all of them drops them.
            n = req.num_tokens + len(req.draft_token_ids) - req.num_computed_tokens
            if n > budget:
                req.draft_token_ids = []
                n = min(req.num_tokens - req.num_computed_tokens, budget)
            while not self.blocks.can_allocate(req.block_table, req.num_computed_tokens + n):
                victim = queue.pop() if queue else None
                if victim is None:  # nothing left to preempt but this request itself
                    self._preempt(req, out)
                    req = None
                    break
                self._preempt(victim, out)
            if req is None:
                break
            self.blocks.allocate(req.block_table, req.num_computed_tokens + n)
            out.scheduled.append(ScheduledRequest(req, n))
            kept.append(req)
            budget -= n
        kept.extend(queue)  # out of token budget: they wait one step, blocks kept
        self.running = kept

        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not out.preempted:
            req = self.waiting[0]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if not self.blocks.can_allocate(req.block_table, req.num_computed_tokens + n):
                break
            self.waiting.popleft()
            self.blocks.allocate(req.block_table, req.num_computed_tokens + n)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.scheduled.append(ScheduledRequest(req, n))
            budget -= n
        if not out.scheduled and self.waiting and not self.running:
            req = self.waiting[0]
            raise RuntimeError(f"request {req.request_id} needs more KV blocks than the cache has "
                               f"({self.blocks.num_blocks} blocks of {self.blocks.block_size}); raise kv_cache_gib")
        return out

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        self.blocks.free(req.block_table)
        req.num_computed_tokens = 0
        req.draft_token_ids = []
        req.status = RequestStatus.WAITING
        if req in self.running:
            self.running.remove(req)
        self.waiting.appendleft(req)
        out.preempted.append(req)

    def fork(self, leader: Request, sibling: Request) -> list[tuple[int, int]]:
        """Start `sibling` from the leader's prompt KV. Returns block copies for the storage to make,
        or queues the sibling for its own prefill if the cache has no room to fork."""
        try:
            table, copies = self.blocks.fork(leader.block_table, leader.num_prompt_tokens)
        except RuntimeError:
            self.add(sibling)
            return []
        sibling.block_table = table
        sibling.num_computed_tokens = leader.num_prompt_tokens
        sibling.status = RequestStatus.RUNNING
        self.running.append(sibling)
        return copies

    def finish(self, req: Request) -> None:
        self.blocks.free(req.block_table)
        req.status = RequestStatus.FINISHED
        if req in self.running:
            self.running.remove(req)
