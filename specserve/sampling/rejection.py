"""Verification of draft tokens: modified rejection sampling (Leviathan et al. 2023; Chen et al. 2023).

For each sequence with drafts x_1..x_k ~ q and target distributions p_1..p_{k+1} (both warped by the
request's temperature / top-k / top-p): accept x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the
first rejection draw from norm(max(0, p_i - q_i)) and stop; if all k are accepted draw a bonus token
from p_{k+1}. The emitted tokens are distributed exactly as sampling from p one token at a time.
A deterministic draft (prompt lookup) is q = one-hot. Greedy is the longest prefix where the draft
equals the target's argmax, plus the target's own next token.

Everything is vectorised over the batch and the draft positions; each sequence still draws its
uniforms from its own generator (its k uniforms, then one for the draw), so a seed reproduces its
output whatever else shares the batch.
"""
from __future__ import annotations

from typing import Optional

import torch


def verify_greedy(target_logits: list[torch.Tensor], drafts: list[list[int]]) -> list[tuple[int, int]]:
    """target_logits[b] [1 + k_b, V] for draft tokens drafts[b] (k_b of them) -> per sequence
    (num_accepted, next_token): the longest prefix where the draft equals the target's argmax, then the
    target's own token. One argmax over all rows: no padding to the longest span (a [B, K + 1, V] copy)."""
    rows = target_logits[0] if len(target_logits) == 1 else torch.cat(target_logits)  # [sum(1 + k_b), V]
    best = rows.argmax(-1).tolist()
    out, row = [], 0
    for d in drafts:
        a = 0
        while a < len(d) and d[a] == best[row + a]:
            a += 1
        out.append((a, best[row + a]))
        row += len(d) + 1
    return out


def _prefix_len(ok: torch.Tensor, num_drafts: torch.Tensor) -> torch.Tensor:
    """ok [B, K] bool -> length of the all-True prefix, capped at num_drafts [B]."""
    K = ok.shape[1]
    ok = ok & (torch.arange(K, device=ok.device)[None, :] < num_drafts[:, None])
    return ok.long().cumprod(dim=1).sum(dim=1)


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) row-wise, [B, V]. Where p <= q everywhere (possible only up to rounding),
    fall back to p."""
    r = (p - q).clamp_(min=0)
    mass = r.sum(-1, keepdim=True)
    return torch.where(mass > 1e-12, r / mass.clamp(min=1e-30), p)


def draw_rows(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row of normalised probs [B, V] by inverting the CDF at uniforms [B] in [0, 1)."""
    cdf = probs.double().cumsum(-1)
    idx = torch.searchsorted(cdf, uniforms.double().reshape(-1, 1).contiguous(), right=True).squeeze(1)
    return idx.clamp_(max=probs.shape[-1] - 1)


def rejection_sample(target_probs: torch.Tensor, draft_probs: Optional[torch.Tensor], draft_tokens: torch.Tensor,
                     num_drafts: torch.Tensor, generators):
    """target_probs [B, K + 1, V]; draft_probs [B, K, V] or None for deterministic drafts;
    draft_tokens [B, K] int64; num_drafts [B]; generators: one per sequence, or a single generator
    for the whole batch (tests) -> (num_accepted [B], next_token [B])."""
    B, K1, V = target_probs.shape
    K = K1 - 1
    dev = target_probs.device
    # Per-sequence randomness: k_b acceptance uniforms, then one for the final draw, from the sequence's
    # own generator; how many it draws depends on its own draft only, not on the batch's longest.
    if isinstance(generators, (list, tuple)):
        u = torch.zeros(B, K1, dtype=torch.float64, device=dev)
        u_final = torch.empty(B, dtype=torch.float64, device=dev)
        for b, (g, k) in enumerate(zip(generators, num_drafts.tolist())):
            draws = torch.rand(k + 1, generator=g, device=dev, dtype=torch.float64)
            u[b, :k] = draws[:k]
            u_final[b] = draws[k]
    else:
        u = torch.rand((B, K1), generator=generators, device=dev, dtype=torch.float64)
        u_final = u[:, K]
    rows = torch.arange(B, device=dev)
    if K:
        p_x = target_probs[:, :K].gather(-1, draft_tokens[..., None]).squeeze(-1).double()  # [B, K]
        q_x = torch.ones_like(p_x) if draft_probs is None else draft_probs.gather(-1, draft_tokens[..., None]).squeeze(-1).double()
        accept = u[:, :K] * q_x < p_x  # u < p / q, with q(x) > 0 for a drafted x
        num_accepted = _prefix_len(accept, num_drafts)
    else:
        num_accepted = torch.zeros(B, dtype=torch.long, device=dev)
    p_next = target_probs[rows, num_accepted]  # [B, V]
    rejected = num_accepted < num_drafts  # else every draft was accepted: bonus token from p
    if bool(rejected.any()):
        at = num_accepted.clamp(max=max(K - 1, 0))
        if draft_probs is None:
            q_next = torch.zeros_like(p_next)
            q_next[rows, draft_tokens[rows, at]] = 1.0
        else:
            q_next = draft_probs[rows, at]
        p_next = torch.where(rejected[:, None], residual_distribution(p_next, q_next), p_next)
    return num_accepted, draw_rows(p_next, u_final)
