"""Penalties on tokens already in the sequence, as vLLM applies them (SamplingParams: repetition_penalty,
presence_penalty, frequency_penalty), min_tokens's hold on the stop tokens, and bad_words, to the rows
of one step's logits.

For a row whose sequence so far is prompt P and output O (the output's count of token v: c_v):

    seen_v   = v in P or c_v > 0
    l_v     <- l_v / r  if seen_v and l_v > 0;   l_v * r  if seen_v and l_v <= 0     (repetition, r)
    l_v     <- l_v - f * c_v - p * [c_v > 0]                                           (frequency f, presence p)
    l_s     <- -inf  for each stop id s (EOS, stop_token_ids) while |O| < min_tokens
    l_t     <- -inf  for each bad word's form ending in t whose other tokens end O     (bad_words.py)

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
from .bad_words import banned


@dataclass
class PenaltySpan:
    """Rows [first, first + 1 + len(paths)) of a step's logits, all of one request: the first after its
    last known token, row first + j + 1 after the draft tokens paths[j] (root to draft token j)."""

    first: int
    params: SamplingParams
    prompt: Sequence[int]
    output: Sequence[int]
    paths: Sequence[tuple[int, ...]] = ()
    stop_ids: Sequence[int] = ()  # the tokens min_tokens holds back: EOS (unless ignore_eos) and stop_token_ids
    bad_words: Sequence[tuple[int, ...]] = ()  # bad_words' token forms (sampling/bad_words.py)


def apply_penalties(logits: torch.Tensor, spans: list[PenaltySpan]) -> None:
    """In place, logits [R, V]: each span's rows penalised as the module docstring says, the rows still
    short of min_tokens (the output so far plus the row's draft tokens) given -inf for the stop ids, and
    each row's bad words' next tokens -inf (sampling/bad_words.py)."""
    with torch.inference_mode():  # the model's logits are inference tensors
        _penalise(logits, [s for s in spans if s.params.penalized])
        cells = [(s.first + row, t) for s in spans if s.bad_words for row, t in banned(s.output, s.paths, s.bad_words)]
        if cells:
            rows, tokens = zip(*cells)
            logits[torch.tensor(rows, device=logits.device), torch.tensor(tokens, device=logits.device)] = float("-inf")
        for s in spans:
            need = s.params.min_tokens - len(s.output)  # tokens still to come before a stop may
            rows = [s.first + j for j, path in enumerate([()] + list(s.paths)) if len(path) < need]
            if rows and s.stop_ids:
                stops = torch.tensor(list(s.stop_ids), dtype=torch.long, device=logits.device)
                logits[torch.tensor(rows, device=logits.device)[:, None], stops[None]] = float("-inf")


def _penalise(logits: torch.Tensor, spans: list[PenaltySpan]) -> None:
    """The penalties, in place.

    Only the cells of tokens a row's sequence holds change, so only those (row, token) cells are
    gathered, penalised and written back: per span its distinct tokens (prompt, output and drafts: a few
    hundred to a few thousand, where the rows hold 49k-262k logits each) times its rows. The counting
    runs in numpy, every span at once, each sequence's tokens sorted once whatever its rows (on arrays
    this short torch's per-call overhead would cost more than the arithmetic)."""
    if not spans:
        return
    V = logits.shape[-1]
    as_ids = lambda xs: np.asarray(xs, dtype=np.int64)  # noqa: E731
    R = np.asarray([1 + len(s.paths) for s in spans], dtype=np.int64)
    first = np.asarray([s.first for s in spans], dtype=np.int64)
    # keys span * V + token: the outputs' occurrences, the drafted tokens' (with their rows), the prompts'
    out = np.concatenate([i * V + as_ids(s.output) for i, s in enumerate(spans)])
    drafted = np.concatenate([i * V + as_ids([t for p in s.paths for t in p]) for i, s in enumerate(spans)])
    drafted_row = np.concatenate([as_ids([j + 1 for j, p in enumerate(s.paths) for _ in p]) for s in spans])  # row in its span
    prompt = np.concatenate([i * V + as_ids(s.prompt if s.params.repetition_penalty != 1 else ()) for i, s in enumerate(spans)])
    keys, inverse = np.unique(np.concatenate([out, drafted, prompt]), return_inverse=True)  # [K] (span, token) pairs
    if not len(keys):
        return
    n_out, n_drafted = len(out), len(drafted)
    span = keys // V
    # every pair in each row of its span: cells grouped by pair, rows 0 .. R-1 within a group
    reps = R[span]
    start = np.cumsum(reps) - reps  # [K] each pair's first cell
    pair = np.repeat(np.arange(len(keys)), reps)  # [C] each cell's pair
    within = np.arange(len(pair)) - start[pair]  # [C] the cell's row within its span
    counts = np.bincount(inverse[:n_out], minlength=len(keys))[pair]  # [C] the output's occurrences
    np.add.at(counts, start[inverse[n_out:n_out + n_drafted]] + drafted_row, 1)  # and the drafts' on the row's path
    prompt_seen = np.zeros(len(keys), dtype=bool)
    prompt_seen[inverse[n_out + n_drafted:]] = True
    seen = (counts > 0) | prompt_seen[pair]
    cell_span = span[pair]
    rep, freq, pres = (np.asarray([getattr(s.params, k) for s in spans], dtype=np.float32)[cell_span]
                       for k in ("repetition_penalty", "frequency_penalty", "presence_penalty"))
    dev, dt = logits.device, logits.dtype
    on = lambda a: torch.from_numpy(a).to(dev, dt)  # noqa: E731
    r, c, f, pr = on(np.where(seen, rep, np.float32(1))), on(counts), on(freq), on(pres)  # counts: exact integers
    index = (torch.from_numpy(first[cell_span] + within).to(dev), torch.from_numpy(keys[pair] % V).to(dev))
    y = logits[index]
    y = torch.where(y > 0, y / r, y * r)  # r = 1 (the same bits) where the penalty is off or the token unseen
    y = y - f * c - pr * (c > 0).to(dt)  # 0 where the penalties are off or the token is not in the output
    logits[index] = y
