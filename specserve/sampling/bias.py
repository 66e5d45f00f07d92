"""OpenAI's logit_bias: an additive term on chosen tokens' logits (SamplingParams.logit_bias)."""
from __future__ import annotations

import torch


def add_logit_bias(logits: torch.Tensor, spans: list[tuple[slice, dict[int, float]]]) -> None:
    """In place, logits [R, V]: every row of each span gets its {token id: bias} added."""
    with torch.inference_mode():  # the model's logits are inference tensors
        for rows, bias in spans:
            ids = torch.tensor(list(bias), dtype=torch.long, device=logits.device)
            add = torch.tensor(list(bias.values()), dtype=logits.dtype, device=logits.device)
            logits[rows, ids] += add
