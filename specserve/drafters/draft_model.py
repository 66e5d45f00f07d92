"""A separate, smaller language model as the draft (Leviathan et al.; Chen et al.): any model that
shares the target's tokenizer. It keeps its own paged KV cache; after verification the rows of the
accepted drafts stay (they were computed on exactly those tokens) and the rest is rolled back."""
from __future__ import annotations

from typing import Optional

import torch

from ..types import Request
from .base import Draft, Drafter
from .common import DraftKV, DraftPicker, autoregressive_drafts


class DraftModelDrafter(Drafter):
    def __init__(self, model, num_blocks: int, block_size: int, attention: str = "split"):
        self.model = model
        a = model.arch
        self.kv = DraftKV(a.num_hidden_layers, num_blocks, block_size, a.num_key_value_heads, a.head_dim,
                          model.dtype, model.device)
        self.picker = DraftPicker(a.vocab_size, model.device)
        self.proposed_at: dict[str, tuple[int, int]] = {}  # rid -> (tokens when drafted, speculative rows)
        self.attention = attention

    @torch.inference_mode()
    def propose(self, requests: list[Request], max_len: int, min_confidence: Optional[float] = None) -> list[Draft]:
        drafts = {r.request_id: Draft() for r in requests}
        live = [r for r in requests if max_len > 0 and self.kv.reserve(r.request_id, r.num_tokens + max_len - 1)]
        self.last_model_passes = self.last_model_batch = 0
        if not live:
            return [drafts[r.request_id] for r in requests]
        # Catch-up: every token the draft has not seen yet (the whole prompt the first time).
        spans = [(r, self.kv.num_done[r.request_id], r.num_tokens) for r in live]
        self.last_catchup_rows = sum(b - a for _, a, b in spans)
        logits = self._forward(live, [[r.token_at(t) for t in range(a, b)] for r, a, b in spans],
                               [a for _, a, _ in spans])
        for r in live:
            self.kv.num_done[r.request_id] = r.num_tokens

        def advance(rows, tokens, reqs, j):
            return self._forward(reqs, [[t] for t in tokens], [r.num_tokens + j for r in reqs])

        drafts.update(autoregressive_drafts(live, max_len, min_confidence, self.picker, logits, advance))
        self.last_model_passes = max(len(drafts[r.request_id].tokens) for r in live)
        self.last_model_batch = len(live)
        for r in live:
            self.proposed_at[r.request_id] = (r.num_tokens, len(drafts[r.request_id].tokens) - 1)
        return [drafts[r.request_id] for r in requests]

    def _forward(self, reqs: list[Request], spans: list[list[int]], starts: list[int]) -> torch.Tensor:
        """Run each request's token span at its positions -> logits of each span's last row [B, vocab]."""
        dev = self.model.device
        q_lens = [len(s) for s in spans]
        kv_lens = [a + n for a, n in zip(starts, q_lens)]
        meta = self.kv.metadata([r.request_id for r in reqs], q_lens, kv_lens, self.attention)
        ids = torch.tensor([t for s in spans for t in s], dtype=torch.long, device=dev)
        pos = torch.tensor([p for a, n in zip(starts, q_lens) for p in range(a, a + n)], dtype=torch.long, device=dev)
        last = torch.cumsum(torch.tensor(q_lens, device=dev), 0) - 1
        return self.model.forward(ids, pos, meta, self.kv.cache.k, self.kv.cache.v, last)

    def observe(self, request: Request, start: int, hidden: Optional[torch.Tensor], num_accepted: int) -> None:
        rid = request.request_id
        at = self.proposed_at.pop(rid, None)
        if start == 0 and self.kv.num_done.get(rid, 0):  # recomputed after preemption
            self.release(request)
        elif at is not None:  # keep the accepted drafts' rows, which were computed on the same tokens
            self.kv.num_done[rid] = at[0] + min(num_accepted, at[1])

    def release(self, request: Request) -> None:
        self.kv.release(request.request_id)
        self.picker.release(request.request_id)
        self.proposed_at.pop(request.request_id, None)
