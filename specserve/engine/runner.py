"""Turns a scheduled step into one flat ragged batch, runs the model, and returns a typed StepOutput:
the logits to sample from and, for every scheduled request, which rows are its own."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Optional

import torch

from ..attention.paged import AttentionMetadata
from ..kv.cache import KVCache
from ..scheduler.scheduler import ScheduledRequest


@dataclass(frozen=True)
class RequestRows:
    """One scheduled request's rows in a step's output."""

    tokens: slice  # its rows of the flat token batch [T] (and of StepOutput.hidden)
    # its logits rows: 1 + num_draft_tokens (after its last known token, then after each draft token:
    # after each tree node's path for a token tree); None for a prompt chunk short of the prompt's end
    logits: Optional[slice]
    # a request scoring its prompt (SamplingParams.prompt_logprobs): its logits rows for the chunk's
    # rows whose next token is a prompt token not yet scored, in order (Request.prompt_logprobs)
    prompt_logits: Optional[slice] = None


@dataclass
class StepOutput:
    scheduled: list[ScheduledRequest]
    logits: torch.Tensor  # [S, vocab] float32
    hidden: Optional[torch.Tensor]  # [T, hidden]: last hidden state before the final norm (when asked)
    rows: list[RequestRows]  # one per scheduled request, same order

    def __iter__(self):
        return iter(zip(self.scheduled, self.rows))


@dataclass
class StepLayout:
    """A step as flat lists: what the eager forward and the static (graph) buffers are built from."""

    token_ids: list[int]  # [T]
    positions: list[int]  # [T]
    q_lens: list[int]  # per scheduled request
    kv_lens: list[int]
    tables: list[list[int]]
    trees: list  # per request: its span's tree rows' parents, or None (a causal span)
    logits_rows: list[int]  # [S] rows of [T] that go through the LM head
    rows: list[RequestRows]


class ModelRunner:
    def __init__(self, model, kv_cache: KVCache, device: torch.device, attention: str = "split",
                 plain_attention: Optional[str] = None, exact_prompts: bool = False):
        """attention: how steps with drafts batch their ragged verify spans ("split" | "pad");
        plain_attention: steps without drafts (default: the same); exact_prompts: prompt chunks too on
        the paged kernel (the int8 mode, below)."""
        self.model = model
        self.kv = kv_cache
        self.device = device
        self.attention = attention
        self.plain_attention = plain_attention or attention
        # int8 activations turn a last-bit difference into a different 8-bit rounding, so prompt chunks
        # too go to the paged kernel, which attends each row to its keys in one order however the
        # prompt was chunked (SDPA's blocking follows the chunk): a prompt's KV never depends on it
        self.paged_max_q = sys.maxsize if exact_prompts else None  # None: the default

    def execute(self, scheduled: list[ScheduledRequest], return_hidden: bool = False) -> StepOutput:
        return self.run_eager(scheduled, self.layout(scheduled), return_hidden)

    def layout(self, scheduled: list[ScheduledRequest]) -> "StepLayout":
        """The one place the row layout is decided: tokens in the order of `scheduled` (each request's
        known tokens, then its draft tokens), logits rows for every request whose step samples."""
        token_ids, positions, q_lens, kv_lens, tables, logits_rows, rows = [], [], [], [], [], [], []
        trees: list = []  # per request: its span's tree rows' parents (a token tree draft) or None
        offset = 0
        for s in scheduled:
            r, start, n = s.request, s.start, s.num_new_tokens
            n_known = r.num_tokens
            token_ids.extend(r.token_slice(start, min(start + n, n_known)))
            tree = None
            d = s.draft
            if start + n > n_known and d.is_tree:
                # a token tree after the last known token (the root): each node at the root's position
                # plus its depth, attending to the context, the span's known tokens (a chain: more than
                # the root after fast-forward) and its ancestors only; the scheduler computes a draft
                # whole or not at all
                known = n_known - start  # span rows 0 .. known - 1; the root is row known - 1
                assert start + n - n_known == len(d.tokens) and known >= 1
                token_ids.extend(d.tokens)
                positions.extend(range(start, n_known))
                positions.extend(n_known - 1 + depth for depth in d.depths())
                tree = [-1] + list(range(known - 1)) + [p + known for p in d.parents]
            else:
                if start + n > n_known:  # draft tokens ride after the known ones
                    token_ids.extend(d.tokens[:start + n - n_known])
                positions.extend(range(start, start + n))
            trees.append(tree)
            q_lens.append(n)
            kv_lens.append(start + n)
            tables.append(r.block_table)
            logits = prompt_logits = None
            if s.samples:
                first = len(logits_rows)
                logits_rows.extend(range(offset + n - 1 - s.num_draft_tokens, offset + n))
                logits = slice(first, len(logits_rows))
            if r.scores_prompt:  # position p's row predicts prompt token p + 1; those scored already are skipped
                lo, hi = max(start, len(r.prompt_logprobs) - 1), min(start + n, r.num_prompt_tokens - 1)
                if lo < hi:
                    first = len(logits_rows)
                    logits_rows.extend(range(offset + lo - start, offset + hi - start))
                    prompt_logits = slice(first, len(logits_rows))
            rows.append(RequestRows(slice(offset, offset + n), logits, prompt_logits))
            offset += n
        return StepLayout(token_ids, positions, q_lens, kv_lens, tables, trees, logits_rows, rows)

    def run_eager(self, scheduled: list[ScheduledRequest], lay: "StepLayout", return_hidden: bool) -> StepOutput:
        """The model's own forward over the step's flat ragged batch."""
        token_ids, positions, q_lens, kv_lens = lay.token_ids, lay.positions, lay.q_lens, lay.kv_lens
        tables, trees, logits_rows, rows = lay.tables, lay.trees, lay.logits_rows, lay.rows
        dev = self.device
        mode = self.attention if any(s.num_draft_tokens for s in scheduled) else self.plain_attention
        meta = AttentionMetadata.build(q_lens, kv_lens, tables, self.kv.block_size, dev, mode=mode,
                                       span_parents=trees if any(t is not None for t in trees) else None,
                                       paged_max_q=self.paged_max_q)
        out = self.model.forward(
            torch.tensor(token_ids, dtype=torch.long, device=dev),
            torch.tensor(positions, dtype=torch.long, device=dev),
            meta, self.kv.k, self.kv.v,
            torch.tensor(logits_rows, dtype=torch.long, device=dev),
            return_hidden=return_hidden,
        )
        logits, hidden = out if return_hidden else (out, None)
        if hidden is not None and self.kv.features is not None:  # beside the KV, for prefix-cache hits
            self.kv.features.index_copy_(0, meta.slot_mapping, hidden.float())
        return StepOutput(list(scheduled), logits, hidden, rows)
