"""Verification of token trees: the longest matching path (greedy) and multi-candidate speculative
sampling (SpecInfer, Miao et al. 2024; the tree form of Leviathan et al.'s rejection sampling).

A sequence's tree holds N drafted nodes in topological order; node j has a token and a parent (-1:
a child of the root, the sequence's last committed token). The target scores the root and every
node in one pass, so row 0 of `target_probs` is the distribution after the root and row j + 1 the
distribution after node j's path. Walking down from the root, at each node its children are tried
in order:

- stochastic draft (children drawn i.i.d. from q, the draft's distribution at that node): accept
  child x with probability min(1, p(x) / q(x)); on rejection p <- norm(max(0, p - q)), and the next
  sibling is tested against the new p;
- deterministic draft (children are the draft's top-k, q = None): siblings are distinct tokens
  drawn without replacement, so accept x with probability p(x); on rejection p <- norm(p without x).

The first accepted child becomes the current node (its own row is the next p, fresh). When no child
is accepted, or the node is a leaf, the step ends with one token drawn from the current p (the
residual after the rejections, or the target's own distribution at a leaf). Either way the emitted
tokens are distributed exactly as sampling from the target one token at a time; greedy is the
longest path whose tokens equal the target's argmax, then the target's own token.

Vectorised over the batch: a loop over tree depth and sibling rank, each a few [B, V] operations.
Each sequence draws a fixed grid of uniforms from its own generator, [max_depth + 1, max_width + 1]
whatever its tree: the w-th child tried at depth d tests with u[d, w], the final draw at depth d uses
u[d, max_width]. So a seed reproduces its output whatever else shares the batch, and a tree that
differs away from the walked path (a near tie in the draft's ranking, as the draft's numbers move
in their last bits with the batch's size) draws the same numbers; the generator also advances by
the same count every step.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from .rejection import draw_rows, residual_distribution


def children_table(parents: Sequence[int], width: Optional[int] = None) -> torch.Tensor:
    """parents [N] (-1: the root's child, else an earlier node) -> [N + 1, W] int64: the node index of
    each row's children in order (row 0: the root, row j + 1: node j), -1 past the last child."""
    kids: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for j, p in enumerate(parents):
        if not -1 <= p < j:
            raise ValueError(f"node {j}: parent {p} must be -1 (the root) or an earlier node")
        kids[p + 1].append(j)
    W = max([len(k) for k in kids] + [width or 0, 1])
    table = torch.full((len(parents) + 1, W), -1, dtype=torch.long)
    for row, k in enumerate(kids):
        table[row, :len(k)] = torch.tensor(k, dtype=torch.long)
    return table


def drop_token(p: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """p [B, V] with token x [B] removed and renormalised: a rejected sibling of a deterministic
    (without replacement) draft. Falls back to p where nothing would be left (rounding only)."""
    r = p.clone()
    r[torch.arange(p.shape[0], device=p.device), x] = 0.0
    mass = r.sum(-1, keepdim=True)
    return torch.where(mass > 1e-12, r / mass.clamp(min=1e-30), p)


def verify_tree_greedy(target_logits: torch.Tensor, tokens: torch.Tensor,
                       children: torch.Tensor) -> tuple[list[list[int]], torch.Tensor]:
    """target_logits [B, N + 1, V]; tokens [B, N]; children [B, N + 1, W] -> (the accepted nodes of
    each sequence, root to leaf; next token [B]): the longest path whose tokens are the argmax."""
    best = target_logits.argmax(-1).tolist()  # [B][N + 1]
    toks, kids = tokens.tolist(), children.tolist()
    paths, nxt = [], []
    for b in range(len(toks)):
        row, path = 0, []
        while (c := next((c for c in kids[b][row] if c >= 0 and toks[b][c] == best[b][row]), None)) is not None:
            path.append(c)
            row = c + 1
        paths.append(path)
        nxt.append(best[b][row])
    return paths, torch.tensor(nxt, dtype=torch.long, device=tokens.device)


def verify_tree(target_probs: torch.Tensor, draft_probs: Optional[torch.Tensor], tokens: torch.Tensor,
                children: torch.Tensor, generators, max_depth: Optional[int] = None,
                max_width: Optional[int] = None) -> tuple[list[list[int]], torch.Tensor]:
    """target_probs [B, N + 1, V] (warped like the request's sampling); draft_probs [B, N + 1, V], the
    distribution each row's children were drawn from, or None for deterministic (top-k) children;
    tokens [B, N] int64 (padding: any id); children [B, N + 1, W] from children_table (padding rows
    -1); generators: one per sequence, or one for the batch (tests); max_depth / max_width: bounds on
    every tree this generator will see (the uniforms' grid; default: N and W) -> (accepted nodes per
    sequence, root to leaf; next token [B])."""
    B, N1, V = target_probs.shape
    N, W = N1 - 1, children.shape[-1]
    D, Wu = max_depth or N, max_width or W  # a path is never deeper than its nodes, nor wider than W
    if Wu < W:
        raise ValueError(f"verify_tree: a node has {W} children, more than max_width {Wu}")
    dev = target_probs.device
    if isinstance(generators, (list, tuple)):
        u = torch.stack([torch.rand(D + 1, Wu + 1, generator=g, device=dev, dtype=torch.float64) for g in generators])
    else:
        u = torch.rand((B, D + 1, Wu + 1), generator=generators, device=dev, dtype=torch.float64)
    rows = torch.arange(B, device=dev)
    row = torch.zeros(B, dtype=torch.long, device=dev)  # current node's row
    p = target_probs[:, 0].double()  # [B, V] current distribution (residual after rejections)
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    accepted = torch.full((B, max(N, 1)), -1, dtype=torch.long, device=dev)  # path, node ids
    depth = torch.zeros(B, dtype=torch.long, device=dev)
    for _ in range(N + 1):  # at most one level per node, plus the final draw
        moved = torch.zeros(B, dtype=torch.bool, device=dev)
        q = None if draft_probs is None else draft_probs[rows, row].double()  # [B, V]
        for w in range(W):
            c = children[rows, row, w]  # [B] node id or -1
            live = ~done & ~moved & (c >= 0)
            if not bool(live.any()):
                continue
            cc = c.clamp(min=0)
            x = tokens[rows, cc]  # [B]
            p_x = p[rows, x]
            q_x = torch.ones_like(p_x) if q is None else q[rows, x]
            ok = live & (u[rows, depth, w] * q_x < p_x)
            bad = live & ~ok
            if bool(bad.any()):
                r = drop_token(p, x) if q is None else residual_distribution(p, q)
                p = torch.where(bad[:, None], r, p)
            if bool(ok.any()):
                accepted[rows[ok], depth[ok]] = cc[ok]
                depth = depth + ok.long()
                row = torch.where(ok, cc + 1, row)
                moved |= ok
        # moving on: the accepted child's own row is the next distribution, fresh
        if bool(moved.any()):
            p = torch.where(moved[:, None], target_probs[rows, row].double(), p)
        done |= ~moved
        if bool(done.all()):
            break
    nxt = draw_rows(p, u[rows, depth, Wu])
    paths = [accepted[b, :int(depth[b])].tolist() for b in range(B)]
    return paths, nxt


def accepted_rows_to_keep(path: Sequence[int]) -> list[tuple[int, int]]:
    """The verify span's rows are [root, node 0, node 1, ...]; after verification the accepted nodes
    `path` (root to leaf) must sit right after the root. -> [(span row now, span row after)] for the
    rows that move (node j is span row j + 1)."""
    return [(j + 1, d) for d, j in enumerate(path, start=1) if j + 1 != d]
