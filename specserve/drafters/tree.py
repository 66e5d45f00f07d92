"""Token trees of drafts: EAGLE-2's dynamic expansion and reranking to a node budget (Li et al. 2024,
"EAGLE-2"; Spector & Re 2023). `expand`, plain Python, is the reference that `grow`, the batched
level-by-level growth both model drafters use (the EAGLE head and a standalone draft model), is tested
against (tests/model/test_eagle.py, tests/model/test_draft_tree_model.py).

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
from typing import Callable, Optional

import torch

from ..types import Draft

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


@dataclass
class FedLevel:
    """The nodes one level feeds to the draft: for each batch row in `requests`, its tree nodes
    `nodes[i]`, which are that request's last len(nodes[i]) fed rows (Growth.fed_parent)."""

    requests: list[int]
    nodes: list[list[int]]


@dataclass
class Growth:
    """A batch's trees as `grow` builds them, with how their nodes were fed to the draft. Fed rows sit
    after the context in the draft's KV in the order they were fed; fed_parent[b][i] is the fed row of
    row i's parent (-1: the context's last row), the span's tree for AttentionMetadata.span_parents."""

    trees: list[TokenTree]
    conf: list[list[float]]  # each node's own draft probability
    depth: list[list[int]]  # each node's depth (1: a child of the root)
    fed_parent: list[list[int]]
    row_of: list[dict[int, int]]  # tree node -> its fed row

    def drafts(self, max_nodes: int) -> list[Draft]:
        """Each tree cut to its max_nodes nodes of highest cumulative confidence, as a Draft."""
        return [Draft(t.tokens, None, c, t.parents).subset(rerank_indices(t, max_nodes))
                for t, c in zip(self.trees, self.conf)]


# run_level(growth, level) -> the draft's logits after each fed node [sum of len(level.nodes), V_draft]
RunLevel = Callable[[Growth, FedLevel], torch.Tensor]


def grow(first_logits: torch.Tensor, depth: int, top_k: int, beam: int, min_confidence: Optional[float],
         vocab: Optional[list[int]], run_level: RunLevel) -> Growth:
    """EAGLE-2 trees for a batch, level by level, as `expand` (the reference) grows one: first_logits
    [B, V_draft] (after each request's last token) give the first level, each request's top_k tokens;
    each further level feeds the `beam` nodes of highest cumulative confidence of the level before
    (those still above min_confidence) in one `run_level` call for the whole batch and takes the top_k
    children of each. vocab: draft id -> target id (a reduced draft vocabulary), or None."""
    B = len(first_logits)
    g = Growth([TokenTree() for _ in range(B)], [[] for _ in range(B)], [[] for _ in range(B)],
               [[] for _ in range(B)], [{} for _ in range(B)])

    def add_children(logits, owners: list[tuple[int, int]]) -> None:
        # logits [R, V_draft] after the nodes `owners` [(batch row, node; -1: the root)]
        probs, ids = torch.softmax(logits.float(), dim=-1).topk(top_k, dim=-1)
        for (b, node), ps, ts in zip(owners, probs.tolist(), ids.tolist()):
            t = g.trees[b]
            base, d = (t.scores[node], g.depth[b][node] + 1) if node >= 0 else (1.0, 1)
            for p, tok in zip(ps, ts):
                t.tokens.append(vocab[tok] if vocab is not None else tok)
                t.parents.append(node)
                t.scores.append(base * p)
                g.conf[b].append(p)
                g.depth[b].append(d)

    add_children(first_logits, [(b, -1) for b in range(B)])
    level = [list(range(len(t))) for t in g.trees]  # each request's newest level
    for _ in range(depth - 1):
        fed, owners = FedLevel([], []), []
        for b, t in enumerate(g.trees):
            best = sorted(level[b], key=lambda j: -t.scores[j])[:beam]
            best = [j for j in best if min_confidence is None or t.scores[j] >= min_confidence]
            if not best:
                continue
            for j in best:
                p = t.parents[j]
                g.row_of[b][j] = len(g.fed_parent[b])
                g.fed_parent[b].append(-1 if p < 0 else g.row_of[b][p])
                owners.append((b, j))
            fed.requests.append(b)
            fed.nodes.append(best)
        if not owners:
            break
        logits = run_level(g, fed)
        before = [len(t) for t in g.trees]
        add_children(logits, owners)
        level = [list(range(n, len(t))) for n, t in zip(before, g.trees)]
    return g
