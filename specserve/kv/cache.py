"""The paged KV storage: one flat array of token slots per layer (slot = block * block_size + offset)."""
from __future__ import annotations

import torch


class KVCache:
    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        self.block_size = block_size
        self.num_blocks = num_blocks
        shape = (num_layers, num_blocks * block_size, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [layers, slots, kv_heads, head_dim]
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @staticmethod
    def bytes_per_block(num_layers, block_size, num_kv_heads, head_dim, dtype: torch.dtype) -> int:
        return 2 * num_layers * block_size * num_kv_heads * head_dim * torch.finfo(dtype).bits // 8

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy whole blocks (src -> dst) in every layer: the private tail of a forked sequence."""
        bs = self.block_size
        for src, dst in copies:
            self.k[:, dst * bs:(dst + 1) * bs] = self.k[:, src * bs:(src + 1) * bs]
            self.v[:, dst * bs:(dst + 1) * bs] = self.v[:, src * bs:(src + 1) * bs]

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
