"""Paged KV bookkeeping: fixed-size blocks, one block table per request, a free list, ref-counts.

Plain Python: it only hands out block numbers. The torch storage lives in kv/cache.py.
A block shared by several requests (n samples of one prompt) has a ref-count > 1 and is
never written: `fork` gives each sibling a private copy of the last, partially filled block.
"""
from __future__ import annotations

from collections import deque


class NoFreeBlocksError(RuntimeError):
    pass


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free_blocks: deque[int] = deque(range(num_blocks))
        self.ref_counts = [0] * num_blocks

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    def blocks_needed(self, block_table: list[int], num_tokens: int) -> int:
        """New blocks a table must get to hold `num_tokens` tokens in total."""
        return max(0, -(-num_tokens // self.block_size) - len(block_table))

    def can_allocate(self, block_table: list[int], num_tokens: int) -> bool:
        return self.blocks_needed(block_table, num_tokens) <= self.num_free_blocks

    def allocate(self, block_table: list[int], num_tokens: int) -> None:
        """Grow `block_table` in place so it holds `num_tokens` tokens."""
        need = self.blocks_needed(block_table, num_tokens)
        if need > self.num_free_blocks:
            raise NoFreeBlocksError(f"need {need} KV blocks, {self.num_free_blocks} free")
        for _ in range(need):
            b = self.free_blocks.popleft()
            self.ref_counts[b] = 1
            block_table.append(b)

    def truncate(self, block_table: list[int], num_tokens: int) -> None:
        """Shrink `block_table` in place to the blocks `num_tokens` tokens need (drops the last r tokens'
        now-empty blocks; speculative decoding rolls back rejected tokens this way)."""
        keep = -(-num_tokens // self.block_size)
        while len(block_table) > keep:
            self._release(block_table.pop())

    def free(self, block_table: list[int]) -> None:
        for b in block_table:
            self._release(b)
        block_table.clear()

    def fork(self, parent_table: list[int], num_tokens: int) -> tuple[list[int], list[tuple[int, int]]]:
        """A child table sharing the parent's first `num_tokens` tokens.

        Full blocks are shared (ref-count + 1); a partially filled last block is copied, since the
        child will write into it. Returns (child table, [(src block, dst block)] to copy in storage)."""
        num_full, partial = divmod(num_tokens, self.block_size)
        if partial and not self.free_blocks:
            raise NoFreeBlocksError("no free block to copy the partial last block into")
        child = list(parent_table[:num_full])
        for b in child:
            self.ref_counts[b] += 1
        copies = []
        if partial:
            dst = self.free_blocks.popleft()
            self.ref_counts[dst] = 1
            child.append(dst)
            copies.append((parent_table[num_full], dst))
        return child, copies

    def _release(self, b: int) -> None:
        self.ref_counts[b] -= 1
        if self.ref_counts[b] == 0:
            self.free_blocks.append(b)
        elif self.ref_counts[b] < 0:
            raise RuntimeError(f"block {b} released more often than allocated")

    def slot(self, block_table: list[int], position: int) -> int:
        """The flat KV slot of the token at `position` in a sequence."""
        return block_table[position // self.block_size] * self.block_size + position % self.block_size
