"""The paged KV storage: one flat array of token slots per layer (slot = block * block_size + offset),
and, for drafters that read the target's last hidden state (EAGLE), that state per slot too: a prefix
cache hit then hands the drafter the features of the positions it skipped."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch


def zeros(shape: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed tensor. On the CPU through calloc (numpy), whose large blocks are fresh zero pages
    mapped on first write: a KV cache costs resident memory only for the blocks sequences use, where
    torch.zeros writes (and so keeps resident) every byte up front."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = int(np.prod(shape)) * torch.empty(0, dtype=dtype).element_size()
    return torch.from_numpy(np.zeros(nbytes, dtype=np.uint8)).view(dtype).view(shape)


class KVCache:
    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        self.block_size = block_size
        self.num_blocks = num_blocks
        shape = (num_layers, num_blocks * block_size, num_kv_heads, head_dim)
        self.k = zeros(shape, dtype, device)  # [layers, slots, kv_heads, head_dim]
        self.v = zeros(shape, dtype, device)
        self.features: Optional[torch.Tensor] = None  # [slots, hidden] float32, once keep_features

    def keep_features(self, hidden_size: int) -> None:
        """Keep the target's last hidden state of every computed slot (ModelRunner writes it beside the
        KV; copies and moves carry it): hidden_size * 4 bytes a token, 5% of the KV for SmolLM2-135M."""
        if self.features is None:
            self.features = torch.zeros(self.k.shape[1], hidden_size, dtype=torch.float32, device=self.k.device)

    def read_features(self, block_table: list[int], n: int) -> Optional[torch.Tensor]:
        """The kept features of positions 0 .. n - 1 of the sequence with this block table [n, hidden]
        (None when features are not kept)."""
        if self.features is None:
            return None
        bs = self.block_size
        slots = [block_table[p // bs] * bs + p % bs for p in range(n)]
        return self.features.index_select(0, torch.tensor(slots, dtype=torch.long, device=self.features.device))

    @staticmethod
    def bytes_per_block(num_layers, block_size, num_kv_heads, head_dim, dtype: torch.dtype) -> int:
        return 2 * num_layers * block_size * num_kv_heads * head_dim * torch.finfo(dtype).bits // 8

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy whole blocks (src -> dst) in every layer: the private tail of a forked sequence."""
        bs = self.block_size
        for src, dst in copies:
            self.k[:, dst * bs:(dst + 1) * bs] = self.k[:, src * bs:(src + 1) * bs]
            self.v[:, dst * bs:(dst + 1) * bs] = self.v[:, src * bs:(src + 1) * bs]
            if self.features is not None:
                self.features[dst * bs:(dst + 1) * bs] = self.features[src * bs:(src + 1) * bs]

    def move_slots(self, src: list[int], dst: list[int]) -> None:
        """Copy token slots src[i] -> dst[i] in every layer, all read before any is written (the ranges
        may overlap): a verified tree keeps its accepted path, whose rows sit wherever the tree put
        them, in consecutive positions after the context; the positions past it are rolled back."""
        if len(src) != len(dst):
            raise ValueError(f"move_slots: {len(src)} sources for {len(dst)} destinations")
        pairs = [(s, d) for s, d in zip(src, dst) if s != d]
        if not pairs:
            return
        s_idx = torch.tensor([s for s, _ in pairs], dtype=torch.long, device=self.k.device)
        d_idx = torch.tensor([d for _, d in pairs], dtype=torch.long, device=self.k.device)
        for cache in (self.k, self.v):
            cache.index_copy_(1, d_idx, cache.index_select(1, s_idx))
        if self.features is not None:
            self.features.index_copy_(0, d_idx, self.features.index_select(0, s_idx))
