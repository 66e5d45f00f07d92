"""Token trees of drafts: EAGLE-2's dynamic expansion and reranking to a node budget (Li et al. 2024,
"EAGLE-2"; Spector & Re 2023). Plain Python: `expand` is the reference the EAGLE drafter's batched,
level-by-level trees are tested against (tests/model/test_eagle.py).

Expansion: from the root, each depth expands the `beam` nodes with the highest cumulative draft
confidence (the product of the draft's probabilities along the path, EAGLE-2's stand-in for the
chance that the path is accepted), each into its `top_k` most likely children. Reranking keeps the
`budget` nodes with the highest cumulative confidence: a child never scores above its parent, so the
kept nodes form a subtree of the expansion (ties broken by creation order keep parents first).

Sizing: a tree of n nodes is verified as n + 1 target rows and, when the confidences are calibrated,
emits 1 + (sum of the kept nodes' confidences) tokens in expectation (every node on an accepted
path is accepted). Which nodes are worth their rows is decided for the whole batch by
speculative/selection.select_drafts on the measured step-time curve: on a GPU extra rows are nearly free
and trees stay wide; on a CPU each row costs a real share of a step, which is what bounds the tree.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

# next_topk(paths) -> per path, the draft's (tokens, probabilities) of its top_k next tokens
NextTopK = Callable[[list[list[int]], int], list[tuple[list[int], list[float]]]]


@dataclass
class TokenTree:
    """Nodes in topological order: tokens[j], parents[j] (-1: the root's child), scores[j] (cumulative
    draft confidence of the path root -> j)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    def path(self, j: int) -> list[int]:
        """Tokens from the root's child down to node j."""
        out = []
        while j >= 0:
            out.append(self.tokens[j])
            j = self.parents[j]
        return out[::-1]

    def expected_tokens(self) -> float:
        """Tokens a verify step emits if the confidences are acceptance probabilities."""
        return 1.0 + sum(self.scores)


def expand(next_topk: NextTopK, depth: int, top_k: int, beam: int) -> TokenTree:
    """EAGLE-2 expansion: `depth` levels, each expanding the `beam` best nodes of the level before
    (by cumulative confidence) into their `top_k` children. One draft call per level, batched over
    the expanded paths: the draft runs only at internal nodes."""
    if depth < 1 or top_k < 1 or beam < 1:
        raise ValueError(f"a tree needs depth, top_k and beam >= 1 (got {depth}, {top_k}, {beam})")
    tree = TokenTree()
    frontier = [-1]  # nodes to expand (-1: the root)
    for _ in range(depth):
        paths = [tree.path(j) if j >= 0 else [] for j in frontier]
        level = []
        for parent, (tokens, probs) in zip(frontier, next_topk(paths, top_k)):
            base = tree.scores[parent] if parent >= 0 else 1.0
            for t, p in list(zip(tokens, probs))[:top_k]:
                tree.tokens.append(int(t))
                tree.parents.append(parent)
                tree.scores.append(base * float(p))
                level.append(len(tree) - 1)
        frontier = sorted(level, key=lambda j: -tree.scores[j])[:beam]
        if not frontier:
            break
    return tree


def rerank_indices(tree: TokenTree, budget: int) -> list[int]:
    """The indices of the `budget` nodes with the highest cumulative confidence, in order."""
    if budget >= len(tree):
        return list(range(len(tree)))
    keep = sorted(sorted(range(len(tree)), key=lambda j: (-tree.scores[j], j))[:max(budget, 0)])
    kept = set(keep)
    assert all(tree.parents[j] < 0 or tree.parents[j] in kept for j in keep), "a kept node lost its parent"
    return keep


def rerank(tree: TokenTree, budget: int) -> TokenTree:
    """The `budget` nodes with the highest cumulative confidence, as a tree in topological order."""
    keep = rerank_indices(tree, budget)
    if len(keep) == len(tree):
        return tree
    index = {j: i for i, j in enumerate(keep)}
    return TokenTree([tree.tokens[j] for j in keep], [index.get(tree.parents[j], -1) for j in keep],
                     [tree.scores[j] for j in keep])
