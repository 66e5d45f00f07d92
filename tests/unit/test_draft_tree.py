"""Draft trees (drafters/tree.py): EAGLE-2 expansion and reranking by hand, and expected tokens
checked against tree verification."""
import pytest
import torch

from specserve.drafters.tree import TokenTree, expand, rerank
from specserve.sampling.tree import children_table, verify_tree

V = 5


def _chain(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(V, V, generator=g).double() * 2, -1)


def _next_topk(M, root):
    def fn(paths, k):
        out = []
        for path in paths:
            last = path[-1] if path else root
            probs, toks = M[last].topk(k)
            out.append((toks.tolist(), probs.tolist()))
        return out
    return fn


def test_expand_by_hand():
    # a draft that always says: token 1 w.p. 0.6, token 2 w.p. 0.3, others 0.1 / 3
    def fn(paths, k):
        return [([1, 2, 0][:k], [0.6, 0.3, 0.1 / 3][:k]) for _ in paths]
    tree = expand(fn, depth=3, top_k=2, beam=1)
    # level 1: [1 (.6), 2 (.3)]; beam 1 expands node 0: [1 (.36), 2 (.18)]; then node 2: [1 (.216), 2 (.108)]
    assert tree.tokens == [1, 2, 1, 2, 1, 2] and tree.parents == [-1, -1, 0, 0, 2, 2]
    assert tree.scores == pytest.approx([0.6, 0.3, 0.36, 0.18, 0.216, 0.108])
    assert tree.path(4) == [1, 1, 1] and tree.expected_tokens() == pytest.approx(2.764)
    wide = expand(fn, depth=2, top_k=2, beam=2)
    assert wide.parents == [-1, -1, 0, 0, 1, 1]
    with pytest.raises(ValueError, match="depth, top_k and beam"):
        expand(fn, depth=0, top_k=2, beam=1)


def test_rerank_keeps_the_best_nodes_as_a_subtree():
    tree = TokenTree([1, 2, 1, 2, 1, 2], [-1, -1, 0, 0, 2, 2], [0.6, 0.3, 0.36, 0.18, 0.216, 0.108])
    small = rerank(tree, 4)  # 0.6, 0.36, 0.3, 0.216
    assert small.tokens == [1, 2, 1, 1] and small.parents == [-1, -1, 0, 2]
    assert small.scores == pytest.approx([0.6, 0.3, 0.36, 0.216])
    children_table(small.parents)  # a valid tree: parents come first
    assert rerank(tree, 10) is tree and len(rerank(tree, 0)) == 0


def test_expected_tokens_match_verification_when_the_draft_is_the_target():
    """With draft probabilities equal to the target's, a node's cumulative confidence is exactly the
    chance its path is accepted, so the mean accepted path length equals the sum of the scores."""
    M, root, n = _chain(1), 3, 20_000
    tree = rerank(expand(_next_topk(M, root), depth=4, top_k=3, beam=2), 8)
    rows = [root] + [tree.path(j)[-1] for j in range(len(tree))]
    target = M[torch.tensor(rows)][None].expand(n, -1, -1)
    tokens = torch.tensor(tree.tokens)[None].expand(n, -1)
    paths, _ = verify_tree(target, None, tokens, children_table(tree.parents)[None].expand(n, -1, -1),
                           torch.Generator().manual_seed(0))
    mean = sum(len(p) for p in paths) / n
    assert mean == pytest.approx(sum(tree.scores), abs=0.03)


@pytest.mark.parametrize("top_k,beam,min_conf", [(2, 1, None), (3, 2, None), (3, 3, 0.05)])
def test_batched_growth_equals_the_reference_expansion(top_k, beam, min_conf):
    """grow (level by level for a batch, as the model drafters feed it) builds expand's trees, and
    each fed row's parent row is its tree parent's fed row."""
    from specserve.drafters.tree import grow
    Ms = [torch.softmax(torch.randn(V, V, generator=torch.Generator().manual_seed(s)).double() * 2, -1) for s in (1, 2)]
    roots = [0, 3]

    def run_level(g, level):
        rows = []
        for b, nodes in zip(level.requests, level.nodes):
            t = g.trees[b]
            for j in nodes:
                assert g.fed_parent[b][g.row_of[b][j]] == (-1 if t.parents[j] < 0 else g.row_of[b][t.parents[j]])
                rows.append(Ms[b][t.tokens[j]].log())
        return torch.stack(rows)

    depth = 4
    g = grow(torch.stack([Ms[b][roots[b]].log() for b in range(2)]), depth, top_k, beam, min_conf, None, run_level)
    for b in range(2):
        fn = _next_topk(Ms[b], roots[b])
        if min_conf is None:
            ref = expand(fn, depth, top_k, beam)
            assert g.trees[b].tokens == ref.tokens and g.trees[b].parents == ref.parents
            assert g.trees[b].scores == pytest.approx(ref.scores)
        else:  # nodes below the threshold are not expanded: every expanded node is above it
            assert all(g.trees[b].scores[j] >= min_conf for j in g.row_of[b])
        assert all(d == len(g.trees[b].path(j)) for j, d in enumerate(g.depth[b]))
    # a vocabulary map turns draft ids into target ids
    mapped = grow(torch.stack([Ms[0][0].log()]), 1, top_k, beam, None, [10 + i for i in range(V)], run_level)
    assert all(t >= 10 for t in mapped.trees[0].tokens)
