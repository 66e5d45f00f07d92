"""Which steps replay a CUDA graph, at which captured size, and how they are padded (no torch).

A step's tokens are flat ([T] over all sequences), so one graph per token count serves every batch
of decode (1 token each) and verify (1 + K each) spans whose total pads up to it: the padding rows
attend to nothing, write no KV and their logits are never read. As vLLM does, small sizes are all
captured and larger ones in growing strides, so padding adds less than half a step past 8 tokens.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

# The longest span a graphed step takes per sequence (a verify span of 1 + K, a token tree); longer
# spans are prompt chunks, which run eagerly (their cost is compute, not launches).
MAX_GRAPH_Q = 16
# Token counts captured by default, up to the engine's max_graph_tokens.
DEFAULT_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256)


def capture_sizes(max_tokens: int, sizes: Sequence[int] = DEFAULT_SIZES) -> list[int]:
    """The token counts to capture: those of `sizes` up to max_tokens, and max_tokens itself (so
    every step up to it has a graph)."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    out = sorted({s for s in sizes if 1 <= s <= max_tokens} | {max_tokens})
    return out


def padded_size(num_tokens: int, sizes: Sequence[int]) -> Optional[int]:
    """The smallest captured size holding num_tokens (sizes sorted ascending); None past the largest."""
    for s in sizes:
        if s >= num_tokens:
            return s
    return None


@dataclass(frozen=True)
class StepShape:
    """What decides whether a step replays a graph: its sequences' query lengths."""

    q_lens: tuple[int, ...]
    max_span: int = 0  # the longest token tree's rows (0: chains only)

    @property
    def num_tokens(self) -> int:
        return sum(self.q_lens)


def graph_size(shape: StepShape, sizes: Sequence[int], max_seqs: int, max_span: int) -> Optional[int]:
    """The captured size a step replays, or None when it runs eagerly: a prompt chunk (a span
    longer than MAX_GRAPH_Q), more sequences than the buffers hold, a tree longer than the tree-mask
    buffer, or more tokens than the largest graph."""
    if not shape.q_lens or len(shape.q_lens) > max_seqs or shape.max_span > max_span:
        return None
    if max(shape.q_lens) > MAX_GRAPH_Q or min(shape.q_lens) < 1:
        return None
    return padded_size(shape.num_tokens, sizes)
