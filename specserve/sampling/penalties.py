"""Penalties on tokens already in the sequence, as vLLM applies them (SamplingParams: repetition_penalty,
presence_penalty, frequency_penalty), to the rows of one step's logits.

For a row whose sequence so far is prompt P and output O (the output's count of token v: c_v):

    seen_v   = v in P or c_v > 0
    l_v     <- l_v / r  if seen_v and l_v > 0;   l_v * r  if seen_v and l_v <= 0     (repetition, r)
    l_v     <- l_v - f * c_v - p * [c_v > 0]                                           (frequency f, presence p)

A verify span's row j + 1 comes after draft token j: its output is O plus the draft tokens on the path
down to j, so the row gets exactly the logits a one-token step there would (the rows' logits are the
same bits, the arithmetic is elementwise), and drafts are verified against the penalised distribution:
speculation stays lossless.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ..types import SamplingParams


@dataclass
class PenaltySpan:
    """Rows [first, first + 1 + len(paths)) of a step's logits, all of one request: the first after its
    last known token, row first + j + 1 after the draft tokens paths[j] (root to draft token j)."""

    first: int
    params: SamplingParams
    prompt: Sequence[int]
    output: Sequence[int]
    paths: Sequence[tuple[int, ...]] = ()


def apply_penalties(logits: torch.Tensor, spans: list[PenaltySpan]) -> None:
    """In place, logits [R, V]: each span's rows penalised as the module docstring says.

    Only the cells of tokens a row's sequence holds change, so those (row, token) cells of every span
    are found at once, gathered, penalised and written back: a few thousand cells where the rows hold
    49k-262k logits each. The counting runs in numpy (on arrays this short torch's per-call overhead
    would cost more than the arithmetic)."""
    V = logits.shape[-1]
    counted, prompt_cells, params = [], [], []  # flat cell ids (row * V + token); per span (first row, rows, params)
    for s in spans:
        R = 1 + len(s.paths)
        rows = s.first + np.arange(R, dtype=np.int64)
        out = np.asarray(s.output, dtype=np.int64)
        counted.append((rows[:, None] * V + out[None]).ravel())  # the output, in every row of the span
        for j, path in enumerate(s.paths):  # row j + 1 also holds the draft tokens down to j
            counted.append((s.first + j + 1) * V + np.asarray(path, dtype=np.int64))
        if s.params.repetition_penalty != 1:
            prompt_cells.append((rows[:, None] * V + np.asarray(s.prompt, dtype=np.int64)[None]).ravel())
        params.append((s.first, R, s.params))
    counted_ = np.concatenate(counted) if counted else np.zeros(0, np.int64)
    cells, inverse = np.unique(np.concatenate([counted_] + prompt_cells), return_inverse=True)
    if not len(cells):
        return
    counts = np.bincount(inverse[:len(counted_)], minlength=len(cells))  # per cell: occurrences in output + path
    seen = counts > 0
    seen[inverse[len(counted_):]] = True  # repetition_penalty's: the prompt's tokens too
    row = cells // V
    rep, freq, pres = (np.zeros(logits.shape[0], np.float32) for _ in range(3))
    rep[:] = 1
    for first, R, p in params:
        rep[first:first + R], freq[first:first + R], pres[first:first + R] = p.repetition_penalty, p.frequency_penalty, p.presence_penalty
    dev, dt = logits.device, logits.dtype
    r = torch.from_numpy(np.where(seen, rep[row], np.float32(1))).to(dev, dt)
    f, pr = torch.from_numpy(freq[row]).to(dev, dt), torch.from_numpy(pres[row]).to(dev, dt)
    c = torch.from_numpy(counts).to(dev, dt)  # exact integers
    index = torch.from_numpy(cells).to(dev)
    with torch.inference_mode():  # the model's logits are inference tensors
        flat = logits.view(-1)
        y = flat[index]
        y = torch.where(y > 0, y / r, y * r)  # r = 1 (the same bits) where the penalty is off or the token unseen
        y = y - f * c - pr * (c > 0).to(dt)  # 0 where the penalties are off or the token is not in the output
        flat[index] = y
