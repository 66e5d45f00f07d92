"""Turns a scheduled step into one flat ragged batch, runs the model, returns the logits to sample."""
from __future__ import annotations

import torch

from ..attention.paged import AttentionMetadata
from ..kv.cache import KVCache
from ..scheduler.scheduler import ScheduledRequest


class ModelRunner:
    def __init__(self, model, kv_cache: KVCache, device: torch.device):
        self.model = model
        self.kv = kv_cache
        self.device = device

    def execute(self, scheduled: list[ScheduledRequest]) -> torch.Tensor:
        """-> logits [S, vocab] float32, one row per request whose step ends at its last known token
        (in the order of `scheduled`)."""
        token_ids, positions, q_lens, kv_lens, tables, logits_rows = [], [], [], [], [], []
        offset = 0
        for s in scheduled:
            r, start, n = s.request, s.request.num_computed_tokens, s.num_new_tokens
            # Slice prompt and output separately: no O(length) copy of the whole sequence per step.
            n_prompt = len(r.prompt_token_ids)
            token_ids.extend(r.prompt_token_ids[start:start + n])
            token_ids.extend(r.output_token_ids[max(0, start - n_prompt):max(0, start + n - n_prompt)])
            positions.extend(range(start, start + n))
            q_lens.append(n)
            kv_lens.append(start + n)
            tables.append(r.block_table)
            offset += n
            if s.samples:
                logits_rows.append(offset - 1)
        dev = self.device
        meta = AttentionMetadata.build(q_lens, kv_lens, tables, self.kv.block_size, dev)
        return self.model.forward(
            torch.tensor(token_ids, dtype=torch.long, device=dev),
            torch.tensor(positions, dtype=torch.long, device=dev),
            meta, self.kv.k, self.kv.v,
            torch.tensor(logits_rows, dtype=torch.long, device=dev),
        )
