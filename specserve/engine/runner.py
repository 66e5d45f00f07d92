"""Turns a scheduled step into one flat ragged batch, runs the model, returns the logits to sample."""
from __future__ import annotations

import torch

from ..attention.paged import AttentionMetadata
from ..kv.cache import KVCache
from ..scheduler.scheduler import ScheduledRequest


class ModelRunner:
    def __init__(self, model, kv_cache: KVCache, device: torch.device, attention: str = "split"):
        self.model = model
        self.kv = kv_cache
        self.device = device
        self.attention = attention

    def execute(self, scheduled: list[ScheduledRequest], return_hidden: bool = False):
        """-> logits [S, vocab] float32 (and hidden [T, hidden] with return_hidden). Rows: for each request
        whose step reaches its last token (in the order of `scheduled`), 1 + its number of draft tokens:
        the distributions after the last known token and after each draft token."""
        token_ids, positions, q_lens, kv_lens, tables, logits_rows = [], [], [], [], [], []
        offset = 0
        for s in scheduled:
            r, start, n = s.request, s.request.num_computed_tokens, s.num_new_tokens
            # Slice prompt and output separately: no O(length) copy of the whole sequence per step.
            n_prompt, n_known = len(r.prompt_token_ids), r.num_tokens
            token_ids.extend(r.prompt_token_ids[start:start + n])
            token_ids.extend(r.output_token_ids[max(0, start - n_prompt):max(0, min(start + n, n_known) - n_prompt)])
            if start + n > n_known:  # draft tokens ride after the known ones
                token_ids.extend(r.draft_token_ids[:start + n - n_known])
            positions.extend(range(start, start + n))
            q_lens.append(n)
            kv_lens.append(start + n)
            tables.append(r.block_table)
            offset += n
            if s.samples:
                logits_rows.extend(range(offset - 1 - len(r.draft_token_ids), offset))
        dev = self.device
        meta = AttentionMetadata.build(q_lens, kv_lens, tables, self.kv.block_size, dev, mode=self.attention)
        return self.model.forward(
            torch.tensor(token_ids, dtype=torch.long, device=dev),
            torch.tensor(positions, dtype=torch.long, device=dev),
            meta, self.kv.k, self.kv.v,
            torch.tensor(logits_rows, dtype=torch.long, device=dev),
            return_hidden=return_hidden,
        )
