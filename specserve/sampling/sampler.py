"""Token sampling: greedy, temperature, top-k, top-p, with one torch.Generator per request so a seed
gives the same output whatever else is in the batch."""
from __future__ import annotations

from typing import Optional

import torch

from .. import kernels
from ..types import SamplingParams


def warp_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [N, vocab] -> probabilities after temperature, min-p, top-k and top-p (one request's params,
    in vLLM's order). Speculative decoding warps target and draft distributions through this same function."""
    logits = logits / params.temperature
    if params.min_p > 0:
        probs = torch.softmax(logits, dim=-1)
        logits = logits.masked_fill(probs < params.min_p * probs.amax(dim=-1, keepdim=True), float("-inf"))
    if params.top_k and params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        probs = _top_p(probs, params.top_p)
    return probs


# Nucleus candidates: a language model's top-p set almost always lies within its 1024 likeliest tokens,
# and topk(1024) costs a fraction of sorting the whole vocabulary (docs/decisions.md#top-p-candidates);
# rows whose nucleus reaches past them sort in full. The same tokens and probabilities.
TOP_P_CANDIDATES = 1024


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """probs [N, vocab] -> the smallest prefix of most likely tokens whose mass reaches top_p (the
    token that crosses it stays), renormalised."""
    k = min(TOP_P_CANDIDATES, probs.shape[-1])
    vals, order = torch.topk(probs, k, dim=-1)  # [N, k], most likely first
    if k < probs.shape[-1] and not bool((vals.sum(dim=-1) >= top_p).all()):
        vals, order = torch.sort(probs, dim=-1, descending=True)  # a nucleus past the candidates
    drop = (torch.cumsum(vals, dim=-1) - vals) >= top_p
    kept = torch.zeros_like(probs).scatter_(-1, order, vals.masked_fill(drop, 0.0))
    return kept / kept.sum(dim=-1, keepdim=True)


def make_generator(seed: Optional[int], device: torch.device) -> torch.Generator:
    g = torch.Generator(device=device)
    if seed is None:
        g.seed()
    else:
        g.manual_seed(seed)
    return g


def draw(probs: torch.Tensor, generator: Optional[torch.Generator]) -> int:
    """One token from probs [vocab] by inverting the CDF with one uniform draw."""
    return draw_many(probs[None], [generator])[0]


def draw_many(probs: torch.Tensor, generators: list[Optional[torch.Generator]]) -> list[int]:
    """One token per row of probs [N, vocab], row r by inverting its CDF at one uniform from generators[r]:
    the first token whose cumulative mass exceeds u * total.

    torch.multinomial draws an exponential per vocabulary entry (about 20x the time of one uniform and
    a binary search over a 49k vocabulary on the CPUs this was built on), for the same distribution.
    On the CPU the kernels' draw_rows sums the mass in blocks (kernels/sampling.cpp: ~6x torch's
    sequential double cumsum over 262k tokens); elsewhere `_draw_cumsum`. The two give the same token
    unless u * total lies within rounding of a boundary between two tokens."""
    u = torch.cat([torch.rand((1,), generator=g, dtype=torch.float64, device=probs.device) for g in generators])
    if probs.device.type == "cpu" and probs.dtype == torch.float32 and kernels.available():
        return kernels.ext().draw_rows(probs.contiguous(), u).tolist()
    return [_draw_cumsum(row, ur) for row, ur in zip(probs, u)]


def _draw_cumsum(probs: torch.Tensor, u: torch.Tensor) -> int:
    """draw's plain form: probs [vocab], u [] -> the first token whose cumulative mass exceeds u * total."""
    cdf = probs.double().cumsum(-1)
    # right=True: the first token whose cumulative mass exceeds u, which always has mass > 0
    return int(torch.searchsorted(cdf, (u * cdf[-1]).reshape(1), right=True).clamp_(max=probs.shape[-1] - 1).item())


def token_logprobs(logits: torch.Tensor, tokens: list[int], top: int) -> tuple[list[float], list[dict[int, float]]]:
    """logits [R, vocab], tokens [R] -> (each token's log-probability under the distribution the rows hold
    (the model's, after the request's guided mask, logit_bias and penalties where it has them),
    per row the `top` most likely {id: logprob}, most likely first; empty dicts when top is 0)."""
    lp = torch.log_softmax(logits.float(), dim=-1)  # [R, vocab]
    chosen = lp[torch.arange(len(tokens), device=lp.device), torch.tensor(tokens, device=lp.device)].tolist()
    if not top:
        return chosen, [{} for _ in tokens]
    vals, ids = lp.topk(top, dim=-1)  # [R, top]
    return chosen, [dict(zip(i, v)) for i, v in zip(ids.tolist(), vals.tolist())]


def sample(logits: torch.Tensor, params: list[SamplingParams], generators: list[Optional[torch.Generator]]
           ) -> tuple[list[int], Optional[tuple[list[float], list[dict[int, float]]]]]:
    """logits [S, vocab] float32, one row per sampling sequence -> (token per row, and where any row's
    params need logprobs (asked for, or to rank n-best samples), token_logprobs(...) for every row with the largest k asked)."""
    greedy = [i for i, p in enumerate(params) if p.greedy]
    tokens = [0] * len(params)
    if greedy:
        # every row greedy (the common batch): no gather of the rows first (on CUDA an index copy
        # and a host-to-device copy of the index a step)
        rows = logits if len(greedy) == len(params) else logits[torch.tensor(greedy, device=logits.device)]
        for i, t in zip(greedy, rows.argmax(dim=-1).tolist()):
            tokens[i] = t
    # Rows with the same params (the n samples of a prompt) are warped together, then each row
    # draws with its own generator.
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(params):
        if not p.greedy:
            groups.setdefault(id(p), []).append(i)
    for rows in groups.values():
        probs = warp_logits(logits[rows] if len(rows) < logits.shape[0] else logits, params[rows[0]])
        for i, t in zip(rows, draw_many(probs, [generators[i] for i in rows])):
            tokens[i] = t
    if not any(p.needs_logprobs for p in params):
        return tokens, None
    return tokens, token_logprobs(logits, tokens, max(p.num_top_logprobs for p in params))
