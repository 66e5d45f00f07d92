"""OpenAI's logit_bias, an additive term on chosen tokens' logits, and vLLM's allowed_token_ids, a mask:
the same in every row of a request, a verify span's too."""
from __future__ import annotations

import torch


def add_logit_bias(logits: torch.Tensor, spans: list[tuple[slice, dict[int, float]]]) -> None:
    """In place, logits [R, V]: every row of each span gets its {token id: bias} added."""
    with torch.inference_mode():  # the model's logits are inference tensors
        for rows, bias in spans:
            ids = torch.tensor(list(bias), dtype=torch.long, device=logits.device)
            add = torch.tensor(list(bias.values()), dtype=logits.dtype, device=logits.device)
            logits[rows, ids] += add


def keep_allowed(logits: torch.Tensor, spans: list[tuple[slice, list[int]]]) -> None:
    """In place, logits [R, V]: in every row of each span, each token but the allowed ones gets -inf
    (vLLM's allowed_token_ids); the allowed ones keep their bits."""
    with torch.inference_mode():
        for rows, allowed in spans:
            ids = torch.tensor(allowed, dtype=torch.long, device=logits.device)
            kept = logits[rows, ids]
            logits[rows] = float("-inf")
            logits[rows, ids] = kept
