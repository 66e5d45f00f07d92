"""Turns a scheduled step into one flat ragged batch, runs the model, and returns a typed StepOutput:
the logits to sample from and, for every scheduled request, which rows are its own."""
from __future__ import annotations

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
    # its logits rows: 1 + num_draft_tokens (after its last known token, then after each draft token);
    # None for a prompt chunk that does not reach the prompt's end
    logits: Optional[slice]


@dataclass
class StepOutput:
    scheduled: list[ScheduledRequest]
    logits: torch.Tensor  # [S, vocab] float32
    hidden: Optional[torch.Tensor]  # [T, hidden]: last hidden state before the final norm (when asked)
    rows: list[RequestRows]  # one per scheduled request, same order

    def __iter__(self):
        return iter(zip(self.scheduled, self.rows))


class ModelRunner:
    def __init__(self, model, kv_cache: KVCache, device: torch.device, attention: str = "split"):
        self.model = model
        self.kv = kv_cache
        self.device = device
        self.attention = attention

    def execute(self, scheduled: list[ScheduledRequest], return_hidden: bool = False) -> StepOutput:
        """The one place the row layout is decided: tokens in the order of `scheduled` (each request's
        known tokens, then its draft tokens), logits rows for every request whose step samples."""
        token_ids, positions, q_lens, kv_lens, tables, logits_rows, rows = [], [], [], [], [], [], []
        offset = 0
        for s in scheduled:
            r, start, n = s.request, s.start, s.num_new_tokens
            # Slice prompt and output separately: no O(length) copy of the whole sequence per step.
            n_prompt, n_known = len(r.prompt_token_ids), r.num_tokens
            token_ids.extend(r.prompt_token_ids[start:start + n])
            token_ids.extend(r.output_token_ids[max(0, start - n_prompt):max(0, min(start + n, n_known) - n_prompt)])
            if start + n > n_known:  # draft tokens ride after the known ones
                token_ids.extend(r.draft.tokens[:start + n - n_known])
            positions.extend(range(start, start + n))
            q_lens.append(n)
            kv_lens.append(start + n)
            tables.append(r.block_table)
            logits = None
            if s.samples:
                first = len(logits_rows)
                logits_rows.extend(range(offset + n - 1 - s.num_draft_tokens, offset + n))
                logits = slice(first, len(logits_rows))
            rows.append(RequestRows(slice(offset, offset + n), logits))
            offset += n
        dev = self.device
        meta = AttentionMetadata.build(q_lens, kv_lens, tables, self.kv.block_size, dev, mode=self.attention)
        out = self.model.forward(
            torch.tensor(token_ids, dtype=torch.long, device=dev),
            torch.tensor(positions, dtype=torch.long, device=dev),
            meta, self.kv.k, self.kv.v,
            torch.tensor(logits_rows, dtype=torch.long, device=dev),
            return_hidden=return_hidden,
        )
        logits, hidden = out if return_hidden else (out, None)
        return StepOutput(list(scheduled), logits, hidden, rows)
