"""cuda/rounds.accept_tree (greedy acceptance of a whole token tree at once) against walking each tree
from its root in Python, on random trees whose target agrees often enough to reach every depth."""
import random

import torch

from specserve.cuda.rounds import accept_tree


def walk(toks, parents, a, K, W):
    """From the root: at each level the node whose parent is the node taken last and whose token is
    the target's argmax there; stop at the first level with none -> (accepted, the nodes taken)."""
    want, cur, path = a[0], None, []
    for j in range(K):
        hits = [i for i in range(W) if toks[j][i] == want and (j == 0 or parents[j][i] == cur)]
        assert len(hits) <= 1  # siblings differ
        if not hits:
            break
        cur = hits[0]
        path.append(cur)
        want = a[1 + j * W + cur]
    return len(path), path


def random_tree(rng: random.Random, K: int, W: int, vocab: int):
    """Level 0: W different tokens; level j: each node a random parent and a token its siblings lack.
    The target's argmax after each node is drawn from the tokens of the level below half the time."""
    toks, parents = [rng.sample(range(vocab), W)], [[-1] * W]
    for _ in range(1, K):
        par = [rng.randrange(W) for _ in range(W)]
        level, used = [], {}
        for p in par:
            t = rng.choice([v for v in range(vocab) if v not in used.setdefault(p, set())])
            used[p].add(t)
            level.append(t)
        toks.append(level)
        parents.append(par)
    guess = lambda j: rng.choice(toks[j]) if j < K and rng.random() < 0.8 else rng.randrange(vocab)  # noqa: E731
    a = [guess(0)] + [guess(j + 1) for j in range(K) for _ in range(W)]
    return toks, parents, a


def test_accept_tree_walks_every_tree_as_the_root_walk_does():
    rng = random.Random(0)
    depths = set()
    for K, W in [(1, 1), (1, 3), (2, 2), (3, 4), (4, 4), (3, 6)]:
        trees = [random_tree(rng, K, W, vocab=8) for _ in range(200)]
        toks = torch.tensor([t for t, _, _ in trees])
        parents = torch.tensor([p for _, p, _ in trees])
        a = torch.tensor([x for _, _, x in trees])
        acc, path = accept_tree(toks, parents, a)
        for b, (t, p, x) in enumerate(trees):
            n, nodes = walk(t, p, x, K, W)
            assert acc[b].item() == n, (K, W, b)
            assert path[b, :n].tolist() == nodes, (K, W, b)
            depths.add((K, n))
    assert {(3, 3), (4, 4), (3, 0)} <= depths  # full depth and none both happened
