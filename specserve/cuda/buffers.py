"""The inputs of a static (graph-replayed) step, preallocated once at their largest size.

Every field is an int32 view of one device tensor, filled from one host tensor (pinned on CUDA) by a
single copy per step: a graph replays the same addresses, so inputs are written into them, never
rebound. Per token (T = the largest captured size):
  ids [T], positions [T]   the token and its RoPE position (a tree node: the root's plus its depth)
  slots [T]                the KV slot the token's K/V are written to; -1 for padding (written nowhere)
  seq [T]                  the row of its sequence in `tables`
  limit [T]                the last KV row of its sequence the token may attend to (kv_len - q_len + i:
                           causal); -1 for padding (attends to nothing, its output is zero)
  tree [T, max_span]       its row of the ancestor mask over its sequence's tree rows (read only for
                           KV rows at or past span_start of its sequence)
Per sequence (B = max_seqs):
  span_start [B]           the first KV row of its token tree; NO_TREE for a chain
  tables [B, max_blocks]   its block table, padded with block 0 (never read past limit)
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

NO_TREE = 1 << 30  # span_start of a chain: no KV row reaches it


def ancestor_rows(parents: Sequence[int]) -> np.ndarray:
    """[L, L] uint8: tree row r may attend to tree row a (a is r or one of its ancestors); the numpy
    twin of attention.paged.ancestor_mask."""
    L = len(parents)
    m = np.eye(L, dtype=np.uint8)
    for r, p in enumerate(parents):
        if p >= 0:
            m[r] |= m[p]
    return m


class StaticInputs:
    FIELDS = ("ids", "positions", "slots", "seq", "limit")

    def __init__(self, max_tokens: int, max_seqs: int, max_blocks: int, max_span: int, block_size: int,
                 device: torch.device):
        self.max_tokens, self.max_seqs, self.max_blocks, self.max_span = max_tokens, max_seqs, max_blocks, max_span
        self.block_size = block_size
        self.device = device
        T, B = max_tokens, max_seqs
        sizes = [T] * len(self.FIELDS) + [B, B * max_blocks, T * max_span]
        self._offsets = np.cumsum([0] + sizes).tolist()
        n = self._offsets[-1]
        pin = device.type == "cuda"
        self.host = torch.zeros(n, dtype=torch.int32, pin_memory=pin)
        self.dev = torch.zeros(n, dtype=torch.int32, device=device)
        self._np = self.host.numpy()
        self._tree_at = self._offsets[7]  # the tree mask comes last: a step copies only its rows of it
        self._copied: Optional[torch.cuda.Event] = None
        views = [self._view(i) for i in range(len(sizes))]
        self.ids, self.positions, self.slots, self.seq, self.limit = views[:5]
        self.span_start = views[5]
        self.tables = views[6].view(B, max_blocks)
        self.tree = views[7].view(T, max_span)
        self.num_tokens = 0  # real tokens of the step last filled

    def _view(self, i: int) -> torch.Tensor:
        return self.dev[self._offsets[i]:self._offsets[i + 1]]

    def _host(self, i: int) -> np.ndarray:
        return self._np[self._offsets[i]:self._offsets[i + 1]]

    def fits(self, q_lens: Sequence[int], tables: Sequence[Sequence[int]], trees: Sequence) -> bool:
        """Whether a step fits the buffers (its tokens, sequences, block tables and trees)."""
        return (sum(q_lens) <= self.max_tokens and len(q_lens) <= self.max_seqs
                and all(len(t) <= self.max_blocks for t in tables)
                and all(p is None or len(p) <= self.max_span for p in trees))

    def fill(self, token_ids: Sequence[int], positions: Sequence[int], q_lens: Sequence[int],
             kv_lens: Sequence[int], tables: Sequence[Sequence[int]], trees: Sequence, padded: int) -> None:
        """Write one step's inputs, its tokens padded up to `padded` (a captured size), and copy them to
        the device. trees: per sequence None (a causal span) or its tree rows' parents, as
        AttentionMetadata.span_parents (the queries are the last q_len of them)."""
        T = len(token_ids)
        if T != sum(q_lens) or len(positions) != T or not T <= padded <= self.max_tokens:
            raise ValueError(f"a step of {T} tokens (q_lens sum {sum(q_lens)}) cannot be padded to {padded}")
        if not self.fits(q_lens, tables, trees):
            raise ValueError("the step does not fit the static buffers (check fits() first)")
        if self._copied is not None:  # the last step's copy must have read the host tensor
            self._copied.synchronize()
        ids, pos, slots, seq, limit = (self._host(i) for i in range(5))
        span_start, tab, tree = self._host(5), self._host(6).reshape(self.max_seqs, -1), self._host(7).reshape(self.max_tokens, -1)
        ids[:T] = token_ids
        pos[:T] = positions
        # per token, vectorised over the step: a Python loop per sequence was a visible share of a graphed step
        q = np.asarray(q_lens, dtype=np.int64)
        B = len(q)
        starts = np.cumsum(q) - q  # each sequence's first row
        seq_of = np.repeat(np.arange(B), q)  # [T]
        kv_rows = np.repeat(np.asarray(kv_lens, dtype=np.int64) - q, q) + np.arange(T) - starts[seq_of]
        for b, table in enumerate(tables):
            tab[b, :len(table)] = table
            tab[b, len(table):] = 0
        bs = self.block_size
        slots[:T] = tab[seq_of, kv_rows // bs].astype(np.int64) * bs + kv_rows % bs
        seq[:T] = seq_of
        limit[:T] = kv_rows
        span_start[:B] = NO_TREE
        for b, par in enumerate(trees):
            if par is not None:
                L, qb, row = len(par), q_lens[b], int(starts[b])
                span_start[b] = kv_lens[b] - L
                tree[row:row + qb, :L] = ancestor_rows(par)[L - qb:]
        # padding: token 0 at position 0, writes no KV, sees no key
        ids[T:padded] = 0
        pos[T:padded] = 0
        slots[T:padded] = -1
        seq[T:padded] = 0
        limit[T:padded] = -1
        n = self._tree_at + padded * self.max_span
        self.dev[:n].copy_(self.host[:n], non_blocking=True)
        if self.device.type == "cuda":
            self._copied = torch.cuda.Event()
            self._copied.record()
        self.num_tokens = T

    def clear(self) -> None:
        """Every token padding (what graphs are captured with: no KV is touched)."""
        h = self._np
        h[:] = 0
        self._host(2)[:] = -1
        self._host(4)[:] = -1
        self._host(5)[:] = NO_TREE
        self.dev.copy_(self.host)
        self.num_tokens = 0
