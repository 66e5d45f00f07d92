"""Paged KV bookkeeping: fixed-size blocks, one block table per request, a free list, ref-counts.

Plain Python: it only hands out block numbers. The torch storage lives in kv/cache.py.
A block shared by several requests (n samples of one prompt, a cached prefix) has a ref-count > 1
and is never written: `fork` gives each sibling a private copy of the last, partially filled block.

Prefix caching (vLLM's automatic prefix caching, SGLang's radix cache, by blocks): a full block of
computed tokens is registered under a key made of its tokens and its parent block's id (`register`),
so a later sequence with the same tokens up to there takes the block instead of computing it again
(`match_prefix`): a shared system prompt, the earlier turns of a chat, a preempted sequence coming back.
Keys chain by the parent's registration id, not by a hash of everything before: two different
prefixes can never share a key (exact, no hash collisions), and once a block is evicted its children
can no longer be reached. A freed registered block keeps its key and waits in an LRU list; blocks are
handed out from the never-registered ones first, then the least recently freed registered one (whose
key is dropped then: evicted).
"""
from __future__ import annotations

from collections import OrderedDict, deque
from typing import Callable, Optional, Sequence


class NoFreeBlocksError(RuntimeError):
    pass


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._fresh: deque[int] = deque(range(num_blocks))  # free, holding nothing anyone may reuse
        self._evictable: OrderedDict[int, None] = OrderedDict()  # free registered blocks, least recently freed first
        self.ref_counts = [0] * num_blocks
        # prefix caching: block -> (parent's id, its tokens) and its registration id; key -> block
        self._key: list[Optional[tuple[int, tuple[int, ...]]]] = [None] * num_blocks
        self._uid: list[int] = [0] * num_blocks  # 0: not registered (the root's id)
        self._cached: dict[tuple[int, tuple[int, ...]], int] = {}
        self._next_uid = 1

    @property
    def num_free_blocks(self) -> int:
        return len(self._fresh) + len(self._evictable)

    @property
    def free_blocks(self) -> set[int]:
        return set(self._fresh) | set(self._evictable)

    @property
    def num_cached_blocks(self) -> int:
        """Registered blocks (in use or waiting for reuse): what prefix caching can hand out."""
        return len(self._cached)

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
            block_table.append(self._take())

    def _take(self) -> int:
        """A free block for new tokens: a never-registered one, else evict the least recently freed."""
        if self._fresh:
            b = self._fresh.popleft()
        else:
            b, _ = self._evictable.popitem(last=False)
            self._unregister(b)
        self.ref_counts[b] = 1
        return b

    def _unregister(self, b: int) -> None:
        key = self._key[b]
        if key is not None and self._cached.get(key) == b:
            del self._cached[key]
        self._key[b], self._uid[b] = None, 0

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
        if partial and not self.num_free_blocks:
            raise NoFreeBlocksError("no free block to copy the partial last block into")
        child = list(parent_table[:num_full])
        for b in child:
            self.ref_counts[b] += 1
        copies = []
        if partial:
            dst = self._take()
            child.append(dst)
            copies.append((parent_table[num_full], dst))
        return child, copies

    def _release(self, b: int) -> None:
        self.ref_counts[b] -= 1
        if self.ref_counts[b] == 0:
            if self._uid[b]:
                self._evictable[b] = None  # most recently freed: evicted last
            else:
                self._fresh.append(b)
        elif self.ref_counts[b] < 0:
            raise RuntimeError(f"block {b} released more often than allocated")

    # --- prefix caching ---------------------------------------------------------------------------
    def match_prefix(self, token_ids: Sequence[int], max_tokens: int) -> list[int]:
        """The registered blocks holding token_ids' longest cached prefix of at most max_tokens tokens
        (whole blocks), each with one more reference: a new table starting with them. [] when prefix
        caching is off."""
        table: list[int] = []
        if not self.enable_prefix_caching:
            return table
        bs, parent = self.block_size, 0
        for i in range(max_tokens // bs):
            b = self._cached.get((parent, tuple(token_ids[i * bs:(i + 1) * bs])))
            if b is None:
                break
            if self.ref_counts[b] == 0:
                del self._evictable[b]
            self.ref_counts[b] += 1
            table.append(b)
            parent = self._uid[b]
        return table

    def register(self, block_table: list[int], token_slice: Callable[[int, int], Sequence[int]], num_tokens: int) -> None:
        """Offer the full blocks of block_table holding the sequence's first num_tokens tokens
        (computed, never to be written again; token_slice(a, b): tokens a..b-1) for reuse. Blocks
        registered before are skipped, so a call per step walks only the newly filled blocks. A
        block whose tokens (after the same prefix) another block already holds takes that block's
        id but no key: it stays private, and its successors chain from the shared id, so they are
        found duplicates too (two sequences computed the same new prefix in one step)."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        full = min(num_tokens // bs, len(block_table))
        first = full
        while first > 0 and not self._uid[block_table[first - 1]]:
            first -= 1
        for i in range(first, full):
            b = block_table[i]
            key = (self._uid[block_table[i - 1]] if i else 0, tuple(token_slice(i * bs, (i + 1) * bs)))
            same = self._cached.get(key)
            if same is not None:
                self._uid[b] = self._uid[same]
                continue
            self._uid[b], self._next_uid = self._next_uid, self._next_uid + 1
            self._key[b] = key
            self._cached[key] = b

    def reset_prefix_cache(self) -> int:
        """Forget every registered prefix (free registered blocks become fresh). Returns how many were."""
        n = len(self._cached)
        for b in range(self.num_blocks):
            if self._uid[b]:
                self._unregister(b)
        for b in list(self._evictable):
            self._fresh.append(b)
        self._evictable.clear()
        return n

    def slot(self, block_table: list[int], position: int) -> int:
        """The flat KV slot of the token at `position` in a sequence."""
        return block_table[position // self.block_size] * self.block_size + position % self.block_size
