"""Attention over a flat ragged batch with a paged KV cache.

Each sequence brings q_len new tokens (a prefill chunk, one decode token, or a span of tokens to
verify) and attends causally to its kv_len cached tokens (the new ones included). The new K/V are
written into their slots first. Two ways to serve a ragged batch (BASS, Qian et al. 2024):
  * SPLIT (mode "split", default): attention per sequence, no padding. On the fp32 CPU path with
    short spans (decode, verification) a C++ kernel reads keys and values straight from the blocks,
    one work item per (sequence, KV head) serving the span's rows x the group's heads, so each key
    row is read once; elsewhere one SDPA call per sequence.
  * PAD (mode "pad"): every sequence's keys are gathered into one padded [B, Lmax] batch (queries
    padded to the longest span) and a single SDPA call serves the whole batch, padding masked out.
Prefill-sized spans always take the padded path (one big batched product beats per-sequence calls).
A sliding-window layer (`window` > 0: Gemma 3's local layers) lets the query at position p see keys
p - window + 1 .. p only, on every path; its blocks before the window are still held (the global
layers of the same sequence read them).
A sequence's last rows may be a token tree (`span_parents`): each of its queries then attends to the
context before the tree and to its own ancestors in the tree only, not to its siblings' branches (tree
attention, SpecInfer / EAGLE-2), in the C++ kernel (a mask row per query) and in the SDPA paths (an
ancestor mask). The tree may be longer than the queries: a drafter growing a tree level by level
feeds one level's nodes while the levels before it are already cached.
A batch that mixes both (a prompt chunk arriving while others decode: the serving steady state) is
served as two groups, short spans by their path and long ones padded among themselves only; padding
every decode row to the prompt chunk's length made such steps ~45x the work (tests/unit/test_paged_attention.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F

from .. import kernels

# Longest query span the paged kernel takes; its cost grows with q_len * kv_len per head, where
# SDPA's batched matrix products win for prefill.
PAGED_KERNEL_MAX_Q = 16


@dataclass
class AttentionMetadata:
    q_lens: list[int]
    kv_lens: list[int]
    block_tables: list[list[int]]
    block_size: int
    device: torch.device
    slot_mapping: torch.Tensor  # [T] flat KV slot of every new token
    mode: str = "split"  # "split" | "pad": how a ragged batch of short spans is served
    # per sequence None (a causal span) or a tree over its last L >= q_len KV rows (the queries are the
    # last q_len of them): each tree row's parent row, -1 for a row under the context directly
    span_parents: Optional[list[Optional[list[int]]]] = None
    # the longest span the paged kernel serves; longer ones (prompt chunks) go to SDPA unless the caller
    # needs every row attended in one fixed order whatever the chunking (the int8 mode: runner.py)
    paged_max_q: Optional[int] = None  # None: PAGED_KERNEL_MAX_Q
    _sdpa: dict = field(default_factory=dict, repr=False)  # window -> sdpa_fields
    _paged: Optional[tuple] = field(default=None, repr=False)
    _groups: Optional[list] = field(default=None, repr=False)

    @property
    def num_seqs(self) -> int:
        return len(self.q_lens)

    @property
    def max_q_len(self) -> int:
        return max(self.q_lens)

    @property
    def paged_limit(self) -> int:
        return PAGED_KERNEL_MAX_Q if self.paged_max_q is None else self.paged_max_q

    @property
    def has_trees(self) -> bool:
        return self.span_parents is not None and any(p is not None for p in self.span_parents)

    @classmethod
    def build(cls, q_lens: list[int], kv_lens: list[int], block_tables: list[list[int]], block_size: int,
              device: torch.device, mode: str = "split",
              span_parents: Optional[list[Optional[list[int]]]] = None,
              paged_max_q: Optional[int] = None) -> "AttentionMetadata":
        if span_parents is not None:
            for q, k, par in zip(q_lens, kv_lens, span_parents):
                if par is not None and (not q <= len(par) <= k or any(not -1 <= a < r for r, a in enumerate(par))):
                    raise ValueError(f"span_parents {par}: need a parent per tree row (at least the {q} queries, at "
                                     f"most the {k} keys), each -1 (the context) or an earlier row")
        slots = []
        for q, k, table in zip(q_lens, kv_lens, block_tables):
            # New tokens sit at the end of each sequence: positions kv_len - q_len ... kv_len - 1.
            slots.extend(table[p // block_size] * block_size + p % block_size for p in range(k - q, k))
        slot_mapping = torch.tensor(slots, dtype=torch.long).to(device, non_blocking=True)
        return cls(list(q_lens), list(kv_lens), block_tables, block_size, device, slot_mapping, mode,
                   None if span_parents is None else list(span_parents), paged_max_q)

    @property
    def use_paged_kernel(self) -> bool:
        """SPLIT with short spans on the fp32 CPU path: the C++ kernel (also used by the fused layer)."""
        return self.mode == "split" and self.max_q_len <= self.paged_limit and self.device.type == "cpu" \
            and kernels.available()

    def span_groups(self) -> Optional[list[tuple["AttentionMetadata", torch.Tensor]]]:
        """[(short spans' metadata, their token rows), (long spans', theirs)] when the batch mixes spans
        of at most PAGED_KERNEL_MAX_Q tokens with longer ones; None otherwise."""
        short = [i for i, q in enumerate(self.q_lens) if q <= self.paged_limit]
        if not short or len(short) == self.num_seqs:
            return None
        if self._groups is None:
            starts = [0]
            for q in self.q_lens:
                starts.append(starts[-1] + q)
            groups = []
            for seqs in (short, [i for i in range(self.num_seqs) if self.q_lens[i] > self.paged_limit]):
                rows = torch.cat([torch.arange(starts[i], starts[i + 1]) for i in seqs]).to(self.device)
                sub = AttentionMetadata([self.q_lens[i] for i in seqs], [self.kv_lens[i] for i in seqs],
                                        [self.block_tables[i] for i in seqs], self.block_size, self.device,
                                        self.slot_mapping[rows], self.mode,
                                        None if self.span_parents is None else [self.span_parents[i] for i in seqs],
                                        self.paged_max_q)
                groups.append((sub, rows))
            self._groups = groups
        return self._groups

    def paged_fields(self):
        """(block_tables [B, max_blocks], q_starts [B], q_lens [B], kv_lens [B], span_lens [B] or None,
        tree_mask [T, Lmax] uint8 or None) as CPU tensors: the C++ kernel's arguments."""
        if self._paged is None:
            tables = _padded_tables(self.block_tables, max(len(t) for t in self.block_tables))
            ql = torch.tensor(self.q_lens, dtype=torch.long)
            span_lens = tree_mask = None
            if self.has_trees:
                spans = [0 if p is None else len(p) for p in self.span_parents]
                span_lens = torch.tensor(spans, dtype=torch.long)
                tree_mask = torch.zeros(sum(self.q_lens), max(spans), dtype=torch.uint8)
                row = 0
                for q, par in zip(self.q_lens, self.span_parents):
                    if par is not None:
                        tree_mask[row:row + q, :len(par)] = ancestor_mask(par)[len(par) - q:]
                    row += q
            self._paged = (tables, torch.cumsum(ql, 0) - ql, ql, torch.tensor(self.kv_lens, dtype=torch.long),
                           span_lens, tree_mask)
        return self._paged

    def sdpa_fields(self, window: int = 0):
        """(gather_slots [B, Lmax], mask [B, 1, qmax, Lmax] or None, q_pad_index, q_unpad_index)."""
        if window not in self._sdpa:
            fields = _build_sdpa_fields(self.q_lens, self.kv_lens, self.block_tables, self.block_size,
                                        self.span_parents if self.has_trees else None, window)
            self._sdpa[window] = tuple(None if t is None else t.to(self.device, non_blocking=True) for t in fields)
        return self._sdpa[window]


def _padded_tables(block_tables: list[list[int]], nblk: int) -> torch.Tensor:
    """[B, nblk] block numbers, cut or padded with block 0 (masked out wherever it is read)."""
    return torch.tensor([t[:nblk] + [0] * (nblk - len(t[:nblk])) for t in block_tables], dtype=torch.long)


def ancestor_mask(parents: list[int]) -> torch.Tensor:
    """[L, L] bool: tree row r may attend to tree row a (a is r or one of its ancestors)."""
    L = len(parents)
    m = torch.eye(L, dtype=torch.bool)
    for r in range(L):
        if parents[r] >= 0:
            m[r] |= m[parents[r]]
    return m


def _tree_positions(q_pos: torch.Tensor, q_lens, kv_lens, span_parents) -> torch.Tensor:
    """q_pos [B, qmax, 1] (row positions) with each tree query's own position: the context before the
    tree plus its depth (a sliding window starts from there)."""
    if not span_parents or all(p is None for p in span_parents):
        return q_pos
    q_pos = q_pos.clone()
    for b, par in enumerate(span_parents):
        if par is not None:
            L, q = len(par), q_lens[b]
            depth = ancestor_mask(par).sum(1) - 1  # [L]
            q_pos[b, :q, 0] = kv_lens[b] - L + depth[L - q:].to(q_pos.device)
    return q_pos


def _build_sdpa_fields(q_lens, kv_lens, block_tables, block_size, span_parents=None, window=0):
    B, qmax, lmax = len(q_lens), max(q_lens), max(kv_lens)
    window = window if 0 < window < lmax else 0  # a window longer than every context masks nothing
    tables = _padded_tables(block_tables, -(-lmax // block_size))
    gather = (tables[:, :, None] * block_size + torch.arange(block_size)).reshape(B, -1)[:, :lmax].contiguous()
    kv, ql = torch.tensor(kv_lens), torch.tensor(q_lens)
    mask = None
    if span_parents or window or not (qmax == 1 and all(k == lmax for k in kv_lens)):
        i = torch.arange(qmax)[None, :, None]  # query row
        j = torch.arange(lmax)[None, None, :]  # key position
        q_pos = (kv - ql)[:, None, None] + i  # absolute position of query row i
        mask = (j <= q_pos) & (i < ql[:, None, None])
        if window:
            mask &= j > _tree_positions(q_pos, q_lens, kv_lens, span_parents) - window
        mask |= (i >= ql[:, None, None]) & (j == 0)  # padded query rows: attend to something, ignored
        for b, par in enumerate(span_parents or []):
            if par is not None:  # a tree: within it, ancestors only
                L = len(par)
                mask[b, :q_lens[b], kv_lens[b] - L:kv_lens[b]] = ancestor_mask(par)[L - q_lens[b]:]
        mask = mask[:, None]
    pad_index = unpad_index = None
    if any(q != qmax for q in q_lens):
        seq_of_token = torch.repeat_interleave(torch.arange(B), ql)
        starts = torch.cumsum(ql, 0) - ql
        i = torch.arange(qmax)[None, :]
        pad_index = torch.where(i < ql[:, None], starts[:, None] + i, 0).reshape(-1)
        unpad_index = seq_of_token * qmax + (torch.arange(len(seq_of_token)) - starts[seq_of_token])
    return gather, mask, pad_index, unpad_index


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, meta: AttentionMetadata, scale: float, window: int = 0) -> torch.Tensor:
    """q [T, H, D], k/v [T, Hkv, D] for the new tokens; k_cache/v_cache [slots, Hkv, D] of this layer;
    window > 0: each query sees its last `window` positions only. Returns [T, H, D]."""
    k_cache.index_copy_(0, meta.slot_mapping, k.to(k_cache.dtype))  # an f16 cache: rounded once, here
    v_cache.index_copy_(0, meta.slot_mapping, v.to(v_cache.dtype))
    return _attend(q, k_cache, v_cache, meta, scale, window)


def _attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
            window: int = 0) -> torch.Tensor:
    """Attention of q [T, H, D] over the cache (the new keys already written) -> [T, H, D]."""
    groups = meta.span_groups()
    if groups is not None:  # short and long spans mixed: each group its own way
        out = torch.empty_like(q)
        for sub, rows in groups:
            out[rows] = _attend(q[rows], k_cache, v_cache, sub, scale, window)
        return out
    T, H, D = q.shape
    if meta.use_paged_kernel and q.dtype == torch.float32 and D % 8 == 0:
        tables, q_starts, q_lens, kv_lens, span_lens, tree_mask = meta.paged_fields()
        return kernels.ext().paged_attention(q.contiguous(), k_cache, v_cache, tables, q_starts, q_lens, kv_lens,
                                             meta.block_size, scale, span_lens, tree_mask, window)
    if meta.num_seqs > 1 and (meta.mode == "split" and meta.max_q_len <= meta.paged_limit
                              or q.device.type == "cpu" and meta.max_q_len > meta.paged_limit):
        # Prompt chunks on CPU too: one SDPA call per sequence, so a prompt's keys and values do not
        # depend on the prompts beside it (the padded batch's kernel blocks over the longest one). The
        # int8 mode needs it: a last-bit difference can move an activation's 8-bit rounding.
        return _split_sdpa(q, k_cache, v_cache, meta, scale, window)
    gather, mask, pad_index, unpad_index = meta.sdpa_fields(window)
    B, qmax = meta.num_seqs, meta.max_q_len
    slots = gather.view(-1)
    keys = k_cache.index_select(0, slots).view(B, -1, *k_cache.shape[1:]).transpose(1, 2).to(q.dtype)  # [B, Hkv, Lmax, D]
    values = v_cache.index_select(0, slots).view(B, -1, *v_cache.shape[1:]).transpose(1, 2).to(q.dtype)
    if pad_index is None:
        qp = q.view(B, qmax, H, D).transpose(1, 2)  # [B, H, qmax, D]
    else:
        qp = q[pad_index].view(B, qmax, H, D).transpose(1, 2)
    out = F.scaled_dot_product_attention(qp, keys, values, attn_mask=mask, scale=scale,
                                         enable_gqa=keys.shape[1] != H)  # [B, H, qmax, D]
    out = out.transpose(1, 2).reshape(B * qmax, H, D)
    return out if unpad_index is None else out[unpad_index]


def _split_sdpa(q, k_cache, v_cache, meta: AttentionMetadata, scale: float, window: int = 0) -> torch.Tensor:
    """SPLIT without the C++ kernel (bf16, CUDA): one SDPA call per sequence over its own keys."""
    H = q.shape[1]
    bs, out, start = meta.block_size, [], 0
    trees = meta.span_parents if meta.has_trees else [None] * meta.num_seqs
    for ql, kl, table, par in zip(meta.q_lens, meta.kv_lens, meta.block_tables, trees):
        blocks = torch.tensor(table[:-(-kl // bs)], dtype=torch.long, device=q.device)
        slots = (blocks[:, None] * bs + torch.arange(bs, device=q.device)).reshape(-1)[:kl]
        keys = k_cache.index_select(0, slots).transpose(0, 1)[None].to(q.dtype)  # [1, Hkv, kl, D]
        values = v_cache.index_select(0, slots).transpose(0, 1)[None].to(q.dtype)
        qs = q[start:start + ql].transpose(0, 1)[None]  # [1, H, ql, D]
        mask = None
        if ql > 1 or par is not None or 0 < window < kl:  # query i sits at position kl - ql + i
            j, q_pos = torch.arange(kl, device=q.device)[None, :], (kl - ql + torch.arange(ql, device=q.device))[:, None]
            mask = j <= q_pos
            if window:
                mask &= j > _tree_positions(q_pos[None], [ql], [kl], [par])[0].to(q.device) - window
            if par is not None:
                L = len(par)
                mask[:, kl - L:] = ancestor_mask(par)[L - ql:].to(q.device)
        o = F.scaled_dot_product_attention(qs, keys, values, attn_mask=mask, scale=scale, enable_gqa=keys.shape[1] != H)
        out.append(o[0].transpose(0, 1))
        start += ql
    return torch.cat(out)
