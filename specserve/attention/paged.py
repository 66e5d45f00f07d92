"""Attention over a flat ragged batch with a paged KV cache.

Each sequence brings q_len new tokens (a prefill chunk, one decode token, or a span of tokens to
verify) and attends to its kv_len cached tokens (the new ones included). The new K/V are written
into their slots, then every sequence's keys are gathered into one padded [B, Lmax] batch so a
single SDPA call serves the whole batch (padding is masked out).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] flat KV slot of every new token
    gather_slots: torch.Tensor  # [B, Lmax] slots of each sequence's keys (padding -> slot 0)
    mask: Optional[torch.Tensor]  # [B, 1, qmax, Lmax] bool, True = attend; None: nothing to mask
    num_seqs: int
    max_q_len: int
    q_pad_index: Optional[torch.Tensor]  # [B * qmax] row of flat q for each padded row (ragged q only)
    q_unpad_index: Optional[torch.Tensor]  # [T] padded row of each flat token (ragged q only)

    @classmethod
    def build(cls, q_lens: list[int], kv_lens: list[int], block_tables: list[list[int]], block_size: int,
              device: torch.device) -> "AttentionMetadata":
        B, qmax, lmax = len(q_lens), max(q_lens), max(kv_lens)
        nblk = -(-lmax // block_size)
        tables = torch.tensor([t[:nblk] + [0] * (nblk - len(t[:nblk])) for t in block_tables], dtype=torch.long)
        offsets = torch.arange(block_size)
        gather = (tables[:, :, None] * block_size + offsets).reshape(B, -1)[:, :lmax].contiguous()  # [B, Lmax]
        kv = torch.tensor(kv_lens)
        ql = torch.tensor(q_lens)
        # New tokens sit at the end of each sequence: positions kv_len - q_len ... kv_len - 1.
        new_pos = torch.cat([torch.arange(k - q, k) for q, k in zip(q_lens, kv_lens)])
        seq_of_token = torch.repeat_interleave(torch.arange(B), ql)
        slot_mapping = gather[seq_of_token, new_pos]

        uniform_q = all(q == qmax for q in q_lens)
        mask = None
        if not (qmax == 1 and all(k == lmax for k in kv_lens)):
            i = torch.arange(qmax)[None, :, None]  # query row
            j = torch.arange(lmax)[None, None, :]  # key position
            q_pos = (kv - ql)[:, None, None] + i  # absolute position of query row i
            mask = (j <= q_pos) & (i < ql[:, None, None])
            mask |= (i >= ql[:, None, None]) & (j == 0)  # padded query rows: attend to something, ignored
            mask = mask[:, None]
        pad_index = unpad_index = None
        if not uniform_q:
            starts = torch.cumsum(ql, 0) - ql
            i = torch.arange(qmax)[None, :]
            pad_index = torch.where(i < ql[:, None], starts[:, None] + i, 0).reshape(-1)
            unpad_index = seq_of_token * qmax + (torch.arange(len(seq_of_token)) - starts[seq_of_token])
        to = lambda t: None if t is None else t.to(device, non_blocking=True)
        return cls(to(slot_mapping), to(gather), to(mask), B, qmax, to(pad_index), to(unpad_index))


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """q [T, H, D], k/v [T, Hkv, D] for the new tokens; k_cache/v_cache [slots, Hkv, D] of this layer.
    Returns [T, H, D]."""
    T, H, D = q.shape
    B, qmax = meta.num_seqs, meta.max_q_len
    k_cache.index_copy_(0, meta.slot_mapping, k)
    v_cache.index_copy_(0, meta.slot_mapping, v)
    slots = meta.gather_slots.view(-1)
    keys = k_cache.index_select(0, slots).view(B, -1, *k_cache.shape[1:]).transpose(1, 2)  # [B, Hkv, Lmax, D]
    values = v_cache.index_select(0, slots).view(B, -1, *v_cache.shape[1:]).transpose(1, 2)
    if meta.q_pad_index is None:
        qp = q.view(B, qmax, H, D).transpose(1, 2)  # [B, H, qmax, D]
    else:
        qp = q[meta.q_pad_index].view(B, qmax, H, D).transpose(1, 2)
    out = F.scaled_dot_product_attention(qp, keys, values, attn_mask=meta.mask, scale=scale,
                                         enable_gqa=keys.shape[1] != H)  # [B, H, qmax, D]
    out = out.transpose(1, 2).reshape(B * qmax, H, D)
    return out if meta.q_unpad_index is None else out[meta.q_unpad_index]
