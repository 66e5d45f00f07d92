"""Token-tree verification (sampling/tree.py): greedy paths by hand, and lossless multi-candidate
sampling checked against the target's distribution over 1e5 draws, with planted bugs that must fail."""
import pytest
import torch

from specserve.sampling import tree
from specserve.sampling.tree import children_table, verify_tree, verify_tree_greedy
from specserve.types import Draft

# root -> nodes 0, 1, 2; node 0 -> nodes 3, 4; node 3 -> node 5; node 1 -> node 6
PARENTS = [-1, -1, -1, 0, 0, 3, 1]
V = 6


def test_children_table_and_depths():
    t = children_table(PARENTS)
    assert t.tolist() == [[0, 1, 2], [3, 4, -1], [6, -1, -1], [-1, -1, -1], [5, -1, -1], [-1, -1, -1],
                          [-1, -1, -1], [-1, -1, -1]]
    assert Draft([0] * len(PARENTS), parents=PARENTS).depths() == [1, 1, 1, 2, 2, 3, 2]
    with pytest.raises(ValueError, match="node 1: parent 1"):
        children_table([-1, 1])


def test_greedy_takes_the_longest_matching_path():
    tokens = torch.tensor([[3, 1, 4, 2, 5, 0, 1]])  # node tokens
    logits = torch.zeros(1, 8, V)
    # argmax after root: 1 (node 1 matches, not node 0); after node 1: 1 (node 6 has token 1); after node 6: 4
    logits[0, 0, 1] = logits[0, 2, 1] = logits[0, 7, 4] = 5.0
    paths, nxt = verify_tree_greedy(logits, tokens, children_table(PARENTS)[None])
    assert paths == [[1, 6]] and nxt.tolist() == [4]
    logits[0, 0] = 0
    logits[0, 0, 0] = 5.0  # now no child of the root matches: no path, the target's own token
    assert verify_tree_greedy(logits, tokens, children_table(PARENTS)[None]) == ([[]], torch.tensor([0]))


def _markov(seed, near=None):
    """M[last] = p(next | last); near: a chain to perturb (a draft that mostly agrees with the target)."""
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(V, V, generator=g).double()
    return torch.softmax(noise * 1.5 if near is None else near.log() + 0.7 * noise, -1)


def _emitted(paths, nxt, tokens):
    return [[int(tokens[b, j]) for j in path] + [int(nxt[b])] for b, path in enumerate(paths)]


def _check_lossless(out, M, root, n, tol):
    """First emitted token ~ M[root]; a second one, given the first is x, ~ M[x]."""
    first = torch.tensor([o[0] for o in out])
    emp = torch.bincount(first, minlength=V).double() / n
    assert (emp - M[root]).abs().max() < tol, (emp, M[root])
    for x in range(V):
        seconds = torch.tensor([o[1] for o in out if len(o) > 1 and o[0] == x], dtype=torch.long)
        if len(seconds) > 5000:
            emp2 = torch.bincount(seconds, minlength=V).double() / len(seconds)
            assert (emp2 - M[x]).abs().max() < 3 * tol, (x, emp2, M[x])


def _run(deterministic, n=100_000, seed=0):
    """A Markov-chain target; the draft is a different chain. Deterministic: children are the draft's
    top-k at each node. Stochastic: each child drawn i.i.d. from the draft at its parent."""
    M = _markov(seed)
    D = _markov(seed + 100, near=M)
    root, g = 2, torch.Generator().manual_seed(seed + 1)
    table = children_table(PARENTS)
    N = len(PARENTS)
    tokens = torch.empty(n, N, dtype=torch.long)
    last = torch.full((n, N + 1), root, dtype=torch.long)  # last token of each row's path
    for j, p in enumerate(PARENTS):
        parent_last = last[:, p + 1]
        if deterministic:  # rank of node j among its siblings -> that rank in the draft's order
            rank = table[p + 1].tolist().index(j)
            tokens[:, j] = D[parent_last].argsort(-1, descending=True)[:, rank]
        else:
            tokens[:, j] = torch.multinomial(D[parent_last], 1, generator=g).squeeze(1)
        last[:, j + 1] = tokens[:, j]
    target = M[last]  # [n, N + 1, V]
    draft = None if deterministic else D[last]
    paths, nxt = verify_tree(target, draft, tokens, table.expand(n, -1, -1), g)
    return _emitted(paths, nxt, tokens), M, root, n, paths


@pytest.mark.parametrize("deterministic", [True, False])
def test_tree_sampling_is_lossless(deterministic):
    out, M, root, n, paths = _run(deterministic)
    _check_lossless(out, M, root, n, tol=0.007)
    # and it does accept drafts, deep ones too: otherwise the test would only check the final draw
    assert sum(len(p) >= 2 for p in paths) > 0.1 * n and sum(len(p) == 3 for p in paths) > 0.01 * n


@pytest.mark.parametrize("deterministic, bug", [(True, "keep"), (True, "unnormalised"), (False, "keep")])
def test_planted_bugs_are_caught(deterministic, bug, monkeypatch):
    """A rejected sibling still drawable, or a residual left unnormalised: the first token's
    distribution moves away from the target's and the check must fail."""
    if deterministic:
        def broken(p, x):
            if bug == "keep":
                return p
            r = p.clone()
            r[torch.arange(p.shape[0]), x] = 0.0
            return r  # not renormalised
        monkeypatch.setattr(tree, "drop_token", broken)
    else:
        monkeypatch.setattr(tree, "residual_distribution", lambda p, q: p)
    out, M, root, n, _ = _run(deterministic, n=100_000)
    with pytest.raises(AssertionError):
        _check_lossless(out, M, root, n, tol=0.007)


def test_seeded_and_batch_independent():
    M = _markov(3)
    tokens = torch.tensor([[0, 1, 2, 3, 4, 5, 0]])
    last = torch.tensor([[2, 0, 1, 2, 3, 4, 5, 0]])
    table = children_table(PARENTS)[None]
    alone = verify_tree(M[last], None, tokens, table, [torch.Generator().manual_seed(7)])
    pair = verify_tree(M[last.repeat(2, 1)], None, tokens.repeat(2, 1), table.repeat(2, 1, 1),
                       [torch.Generator().manual_seed(99), torch.Generator().manual_seed(7)])
    assert alone[0][0] == pair[0][1] and alone[1][0] == pair[1][1]


def test_the_accepted_path_moves_next_to_the_root_in_the_kv_cache():
    """KV rows of a tree span: root at position 10, nodes after it. Path [1, 6] (span rows 2 and 7)
    must end at positions 11 and 12 in every layer; the context stays as it was."""
    from specserve.kv.cache import KVCache
    from specserve.sampling.tree import accepted_rows_to_keep
    kv = KVCache(num_layers=2, num_blocks=6, block_size=4, num_kv_heads=1, head_dim=2, dtype=torch.float32,
                 device=torch.device("cpu"))
    kv.k.copy_(torch.arange(kv.k.numel(), dtype=torch.float32).view_as(kv.k))
    kv.v.copy_(-kv.k)
    kv.keep_features(3)  # the target's hidden states beside the KV (EAGLE with prefix caching) move too
    kv.features.copy_(torch.arange(kv.features.numel(), dtype=torch.float32).view_as(kv.features))
    before_k, before_v, before_f = kv.k.clone(), kv.v.clone(), kv.features.clone()
    table, root = [2, 0, 5, 1, 4], 10  # positions -> slots through a scattered block table

    def slot(p):
        return table[p // 4] * 4 + p % 4
    moves = accepted_rows_to_keep([1, 6])
    assert moves == [(2, 1), (7, 2)]
    kv.move_slots([slot(root + a) for a, _ in moves], [slot(root + b) for _, b in moves])
    for layer in range(2):
        assert torch.equal(kv.k[layer, slot(11)], before_k[layer, slot(12)])  # span row 2 -> row 1
        assert torch.equal(kv.k[layer, slot(12)], before_k[layer, slot(17)])  # span row 7 -> row 2
        assert torch.equal(kv.v[layer, slot(12)], before_v[layer, slot(17)])
        for p in range(root + 1):
            assert torch.equal(kv.k[layer, slot(p)], before_k[layer, slot(p)])
    assert torch.equal(kv.features[slot(12)], before_f[slot(17)])
    assert torch.equal(kv.read_features(table, 13), torch.stack([kv.features[slot(p)] for p in range(13)]))
    assert torch.equal(kv.read_features(table, 11)[:11], before_f[[slot(p) for p in range(11)]])
    assert accepted_rows_to_keep([0]) == [] and accepted_rows_to_keep([]) == [] and accepted_rows_to_keep([0, 3]) == [(4, 2)]
    with pytest.raises(ValueError, match="2 sources for 1"):
        kv.move_slots([1, 2], [3])


def test_a_tree_that_differs_off_the_walked_path_draws_the_same():
    """The uniforms are keyed by (depth, sibling rank) on a fixed grid: extra nodes the walk never
    reaches change nothing, and the generator always advances by the same count."""
    M = _markov(4)
    base = [-1, -1, 0, 2]  # root -> 0, 1; 0 -> 2 -> 3
    extra = base + [1, 4]  # node 1 grows a branch: 1 -> 4 -> 5

    top = lambda t, r=0: int(M[t].argsort(descending=True)[r])
    n0 = top(5)  # the target's likeliest tokens, so that the walk goes deep
    n2 = top(n0)
    n3 = top(n2)
    toks = [n0, top(5, 1), n2, n3, 0, 1]

    def run(parents, seed):
        tokens = torch.tensor([toks[:len(parents)]])
        last = torch.tensor([[5] + [toks[j] for j in range(len(parents))]])
        g = torch.Generator().manual_seed(seed)
        paths, nxt = verify_tree(M[last], None, tokens, children_table(parents, width=3)[None], [g],
                                 max_depth=8, max_width=3)
        return paths[0], nxt.tolist(), torch.rand(1, generator=g).item()

    compared = 0
    for seed in range(40):
        a, b = run(base, seed), run(extra, seed)
        if a[0][:1] == [0]:  # the walk went down node 0, away from node 1's branch
            assert a == b
            compared += 1
    assert compared >= 5
