"""Continuous batching: each step, decide how many new tokens every request brings.

Decode-maximal batching (SARATHI): running requests that decode go first (their token, and their
drafts), then prompt chunks fill what is left of the step's prefill budget (`prefill_chunk`, measured
on the machine: speculative/calibration.py): running prefills first, then waiting requests admitted while the
budget, the sequence limit and free KV blocks allow. So a long prompt arriving never stalls the
running decodes for more than one chunk's pass, and a prompt longer than the budget is prefilled in
chunks. A request with draft tokens (`schedule(drafts)`: the controller's DraftBatch) brings them too
(1 + k tokens to verify), and its ScheduledRequest records the draft, the one place it lives until
verification (vLLM v1's `SchedulerOutput.scheduled_spec_decode_tokens`). As in vLLM v1, scheduling a
request moves its `num_computed_tokens` past the step's tokens (the step computes them), and
`keep_rows` moves it back over the rejected drafts after verification, freeing the blocks they alone
used (a token tree's accepted path first moves up next to its root).
When blocks run out, the newest running request is preempted: its blocks are freed and it is
recomputed later (its generated tokens are kept). With prefix caching, a request admitted starts
from the cached blocks of its longest cached prefix (kv/block_manager.py), and every request's full
blocks of computed tokens are registered once computed (at the next step, when it finishes or is
preempted). Plain Python.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Optional, Sequence

from ..kv.block_manager import BlockManager
from ..types import Draft, DraftBatch, Request, RequestStatus


@dataclass(frozen=True)
class ScheduledRequest:
    request: Request
    start: int  # the step computes the KV of positions start .. start + num_new_tokens - 1
    num_new_tokens: int  # known tokens, then the draft's tokens riding after them
    draft: Optional[Draft] = None  # the draft verified this step (computed whole or not at all)
    # Whether this step reaches the request's last known token (and its drafts), so its logits pick
    # the next token(s): 1 + num_draft_tokens logits rows. False for a prompt chunk short of its end.
    samples: bool = True

    @property
    def num_draft_tokens(self) -> int:
        return 0 if self.draft is None else len(self.draft.tokens)


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 prefill_chunk: Optional[int] = None):
        self.blocks = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        # prompt tokens per step, less the decodes' tokens but at least a block (prompts always move);
        # None: whatever the step's budget leaves
        self.prefill_chunk = prefill_chunk
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # prefix caching, in tokens: looked up at admission, and found (vLLM's prefix_cache_queries / hits)
        self.prefix_queries = 0
        self.prefix_hits = 0

    def add(self, request: Request) -> None:
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, drafts: Optional[DraftBatch] = None) -> SchedulerOutput:
        """drafts: this step's drafts by request id (SpeculativeDecoder.propose), for decoding requests."""
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        kept: list[Request] = []
        for req in self.running:  # what the last step computed becomes shareable
            self._register(req)
        # decodes first, then prefills (preemption takes from the end: a prefill before a decode)
        queue = [r for r in self.running if r.past_prompt] + [r for r in self.running if not r.past_prompt]
        prefill = None  # prompt tokens this step may still take, fixed once the decodes are in
        while queue and budget > 0:
            req = queue.pop(0)
            if prefill is None and not req.past_prompt:
                prefill = self._prefill_budget(budget)
            # Draft tokens are just more tokens to compute; a budget too small for all of them drops them.
            draft = drafts.get(req.request_id) if drafts else None
            n = req.num_tokens + (0 if draft is None else len(draft.tokens)) - req.num_computed_tokens
            if n > budget:
                draft = None
                n = min(req.num_tokens - req.num_computed_tokens, budget)
            if prefill is not None:
                n = min(n, prefill)
                if n == 0:  # out of prefill budget: it waits a step, blocks kept
                    kept.append(req)
                    continue
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
            out.scheduled.append(self._computes(req, n, draft))
            kept.append(req)
            budget -= n
            if prefill is not None:
                prefill -= n
        kept.extend(queue)  # out of token budget: they wait one step, blocks kept
        self.running = kept

        if prefill is None:
            prefill = self._prefill_budget(budget)
        while self.waiting and min(budget, prefill) > 0 and len(self.running) < self.max_num_seqs and not out.preempted:
            req = self.waiting[0]
            if not req.block_table:  # its longest cached prefix (the last token is always computed: its logits;
                # a prompt being scored computes the rows it has not scored: a cached one has no logits)
                limit = min(len(req.prompt_logprobs) - 1, req.num_tokens - 1) if req.scores_prompt else req.num_tokens - 1
                req.block_table = self.blocks.match_prefix(req.all_token_ids, limit)
                req.num_computed_tokens = len(req.block_table) * self.blocks.block_size
                if not req.output_token_ids:
                    req.num_cached_tokens = req.num_computed_tokens
                if self.blocks.enable_prefix_caching:
                    self.prefix_queries += req.num_tokens - 1
                    self.prefix_hits += req.num_computed_tokens
            n = min(req.num_tokens - req.num_computed_tokens, budget, prefill)
            if not self.blocks.can_allocate(req.block_table, req.num_computed_tokens + n):
                self.blocks.free(req.block_table)  # cached blocks go back to the LRU list, still cached
                req.num_computed_tokens = 0
                break
            self.waiting.popleft()
            self.blocks.allocate(req.block_table, req.num_computed_tokens + n)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.scheduled.append(self._computes(req, n))
            budget -= n
            prefill -= n
        if not out.scheduled and self.waiting and not self.running:
            req = self.waiting[0]
            raise RuntimeError(f"request {req.request_id} needs more KV blocks than the cache has "
                               f"({self.blocks.num_blocks} blocks of {self.blocks.block_size}); raise kv_cache_gib")
        return out

    def prompt_rows_next(self) -> int:
        """About how many prompt tokens the next step will carry beside the decodes (the SARATHI chunk),
        for a draft selection to price its rows on top of: drafts in a step that also takes a chunk
        of 16 prompt tokens beside 8 decodes cross the block kernel's 32-row limit after 8 rows."""
        decodes = sum(1 for r in self.running if r.past_prompt)
        budget = self._prefill_budget(max(0, self.max_num_batched_tokens - decodes))
        queue = [r for r in self.running if not r.past_prompt]
        pending = sum(r.num_tokens - r.num_computed_tokens for r in queue)
        if len(self.running) < self.max_num_seqs:
            for r in self.waiting:  # the queue's head is enough: the step takes `budget` at most
                if pending >= budget:
                    break
                pending += r.num_tokens - r.num_computed_tokens
        return min(pending, budget)

    def _prefill_budget(self, budget: int) -> int:
        """Prompt tokens this step may take once the decodes are in (budget: what they left)."""
        if self.prefill_chunk is None:
            return budget
        used = self.max_num_batched_tokens - budget
        return min(budget, max(self.prefill_chunk - used, self.blocks.block_size))

    @staticmethod
    def _computes(req: Request, n: int, draft: Optional[Draft] = None) -> ScheduledRequest:
        """The step computes n more tokens of req (blocks already allocated), then `draft` if it has
        one (n counts its tokens): record it, move on."""
        num_draft = 0 if draft is None else len(draft.tokens)
        s = ScheduledRequest(req, req.num_computed_tokens, n, draft,
                             samples=req.num_computed_tokens + n == req.num_tokens + num_draft)
        req.num_computed_tokens += n
        return s

    def rollback(self, req: Request, num_tokens: int) -> None:
        """Forget the last num_tokens computed tokens (rejected drafts): `num_computed_tokens` moves back
        and blocks that held only those tokens are released (a block shared with a forked sibling just
        loses this request's reference). Their KV slots are simply overwritten by later steps."""
        if not 0 <= num_tokens <= req.num_computed_tokens:
            raise ValueError(f"cannot roll back {num_tokens} of {req.request_id}'s {req.num_computed_tokens} computed tokens")
        if num_tokens:
            req.num_computed_tokens -= num_tokens
            self.blocks.truncate(req.block_table, req.num_computed_tokens)

    def keep_rows(self, req: Request, span_start: int, rows: Sequence[int]) -> list[tuple[int, int]]:
        """A verified span computed from position span_start keeps its rows `rows` (increasing, from
        0: a chain's accepted prefix, or a token tree's root and accepted path): they take positions
        span_start, span_start + 1, ... and everything after is rolled back. Returns the (from, to) KV
        slot copies for the storage to make (KVCache.move_slots), none for a chain."""
        end = span_start + len(rows)
        if not 0 <= span_start <= end <= req.num_computed_tokens or any(b <= a for a, b in zip(rows, rows[1:])):
            raise ValueError(f"cannot keep rows {list(rows)} of {req.request_id}'s span at {span_start} "
                             f"({req.num_computed_tokens} computed tokens)")
        bs, table = self.blocks.block_size, req.block_table
        moves = [(table[(span_start + a) // bs] * bs + (span_start + a) % bs, table[p // bs] * bs + p % bs)
                 for p, a in enumerate(rows, start=span_start) if span_start + a != p]
        self.rollback(req, req.num_computed_tokens - end)
        return moves

    def _register(self, req: Request) -> None:
        """Offer req's full blocks of computed known tokens for reuse (prefix caching)."""
        self.blocks.register(req.block_table, req.token_slice, min(req.num_computed_tokens, req.num_tokens))

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        self._register(req)
        self.blocks.free(req.block_table)
        req.num_computed_tokens = 0
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

    def abort(self, req: Request) -> None:
        """Drop req wherever it is (waiting or running) and free its blocks, registering none of them: an
        abort may come from a step that failed midway, whose scheduled tokens were never computed."""
        if req in self.waiting:
            self.waiting.remove(req)
        self.finish(req, register=False)

    def finish(self, req: Request, register: bool = True) -> None:
        if register:
            self._register(req)
        self.blocks.free(req.block_table)
        req.status = RequestStatus.FINISHED
        if req in self.running:
            self.running.remove(req)

