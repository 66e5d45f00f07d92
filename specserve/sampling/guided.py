"""Grammar masks on logits (guided generation): the rows of constrained sequences keep only the tokens
their grammar allows; everything downstream (greedy argmax, sampling, rejection sampling of drafts,
log-probabilities) then sees the constrained distribution."""
from __future__ import annotations

from typing import Sequence

import torch

_BITS = torch.arange(32, dtype=torch.int32)


def allow_all(rows: int, vocab: int) -> torch.Tensor:
    """A bitmask [rows, ceil(vocab / 32)] int32 with every token allowed (rows a grammar leaves open)."""
    return torch.full((rows, (vocab + 31) // 32), -1, dtype=torch.int32)


def apply_bitmask(logits: torch.Tensor, rows: Sequence[int], bitmask: torch.Tensor) -> None:
    """In place: logits [R, V]; rows: which of them; bitmask [len(rows), words] int32 (bit t of word
    t // 32: token t allowed). Tokens past the bitmask's width (a model vocabulary padded beyond the
    tokenizer's) are never allowed."""
    if not len(rows):
        return
    V = logits.shape[-1]
    allowed = ((bitmask.unsqueeze(-1) >> _BITS) & 1).bool().view(len(rows), -1)  # [n, words * 32]
    if allowed.shape[1] < V:
        allowed = torch.cat([allowed, allowed.new_zeros(len(rows), V - allowed.shape[1])], dim=1)
    idx = torch.as_tensor(list(rows), device=logits.device)
    with torch.inference_mode():  # the model's logits are inference tensors
        logits[idx] = logits[idx].masked_fill(~allowed[:, :V].to(logits.device), float("-inf"))
