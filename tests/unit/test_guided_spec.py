"""Constrained sampling with speculation is constrained sampling: the engine's draft pruning and
row masking (engine/guided.py) around the rejection sampler, on a toy grammar over six tokens, give
the first two tokens with exactly the target's constrained distribution (chi-square over 6e4 draws).
Planted bugs (a refused draft token cut instead of kept as a sure rejection; the mask applied after
the rejection test) fail the same test."""
import math

import pytest
import torch

from specserve.engine.guided import GuidedDecoding, prune_drafts
from specserve.sampling.rejection import rejection_sample
from specserve.types import Draft, Request, SamplingParams

V, K, ROOT = 6, 2, 0
# the toy grammar: which tokens may follow each token
ALLOWED = {0: {1, 2, 3}, 1: {0, 2, 4}, 2: {1, 3, 5}, 3: {0, 1}, 4: {2, 5}, 5: {0, 3, 4}}


class ToyGuide:
    """The Guide interface (guided/grammar.py) for ALLOWED, starting after ROOT."""

    vocab_size = V

    def __init__(self):
        self.seq = [ROOT]

    def valid_prefix(self, tokens):
        last, n = self.seq[-1], 0
        for t in tokens:
            if t not in ALLOWED[last]:
                break
            last, n = t, n + 1
        return n

    def advance(self, tokens):
        n = self.valid_prefix(tokens)
        self.seq += list(tokens[:n])
        return n

    def accept(self, tokens):
        if self.valid_prefix(tokens) < len(tokens):
            return False
        self.seq += list(tokens)
        return True

    def rollback(self, n):
        del self.seq[len(self.seq) - n:]

    def fill_mask(self, bitmask, row):
        bitmask[row, 0] = sum(1 << t for t in ALLOWED[self.seq[-1]])


def _tables(seed=0):
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(V, V, generator=g) * 1.5  # target logits after each token
    # the draft proposes refused tokens often (half its mass), and differs from the target elsewhere
    draft = torch.softmax(torch.randn(V, V, generator=g), -1)
    for a in range(V):
        refused = [t for t in range(V) if t not in ALLOWED[a]]
        draft[a, refused] *= 0.5 * draft[a].sum() / draft[a, refused].sum()
        draft[a] /= draft[a].sum()
    return target, draft


def _constrained(target, last):
    p = torch.full((V,), float("-inf"))
    allowed = sorted(ALLOWED[last])
    p[allowed] = target[last, allowed]
    return torch.softmax(p, -1)


def _draws(n, prune, mask_before, seed=1):
    target, draft = _tables()
    g = torch.Generator().manual_seed(seed)
    toks = torch.zeros(n, K, dtype=torch.long)
    toks[:, 0] = torch.multinomial(draft[ROOT].expand(n, V), 1, generator=g)[:, 0]
    toks[:, 1] = torch.multinomial(draft[toks[:, 0]], 1, generator=g)[:, 0]
    reqs = [Request(str(i), [ROOT], SamplingParams(temperature=1.0)) for i in range(n)]
    guides = [ToyGuide() for _ in range(n)]
    drafts = {r.request_id: Draft(toks[i].tolist(), draft[torch.tensor([ROOT, toks[i, 0]])], [0.5] * K)
              for i, r in enumerate(reqs)}
    drafts = prune(drafts, {r.request_id: (guides[i], r.params) for i, r in enumerate(reqs)})
    kept = [drafts.get(r.request_id) for r in reqs]
    num = torch.tensor([0 if d is None else len(d.tokens) for d in kept])
    tokens = torch.zeros(n, K, dtype=torch.long)
    q = torch.zeros(n, K, V)
    logits = torch.zeros(n, K + 1, V)
    for i in range(n):
        k = int(num[i])
        if k:
            tokens[i, :k] = torch.tensor(kept[i].tokens)
            q[i, :k] = kept[i].probs
        ctx = [ROOT] + tokens[i, :k].tolist()
        logits[i, :k + 1] = target[ctx]
    flat = logits.view(n * (K + 1), V)
    spans = [(i * (K + 1), guides[i], kept[i]) for i in range(n)]
    if mask_before:
        GuidedDecoding.mask_rows(flat, spans)
    p = torch.softmax(logits, -1)
    n_acc, nxt = rejection_sample(p, q, tokens, num, g)
    if not mask_before:  # planted bug: the grammar only shapes the token drawn at the end
        GuidedDecoding.mask_rows(flat, spans)
        p2 = torch.softmax(logits, -1)
        nxt = torch.multinomial(p2[torch.arange(n), n_acc], 1, generator=g)[:, 0]
    first = torch.where(n_acc >= 1, tokens[:, 0], nxt)
    second = torch.where(n_acc >= 2, tokens[:, 1], torch.where(n_acc == 1, nxt, -1))
    # where only one token came out, the next step samples the second from the constrained target
    todo = second < 0
    nexts = torch.stack([_constrained(target, int(t)) for t in first[todo]]) if bool(todo.any()) else None
    if nexts is not None:
        second[todo] = torch.multinomial(nexts, 1, generator=g)[:, 0]
    return first, second, target


def _z(first, second, target):
    """Wilson-Hilferty z of the chi-square of the (first, second) counts against the exact
    constrained distribution (a large z: not that distribution)."""
    n = len(first)
    counts = torch.zeros(V, V)
    counts.index_put_((first, second), torch.ones(n), accumulate=True)
    p1 = _constrained(target, ROOT)
    chi, cells = 0.0, 0
    for a in range(V):
        pa = _constrained(target, a)
        for b in range(V):
            e = n * float(p1[a] * pa[b])
            if e > 0:
                chi += (float(counts[a, b]) - e) ** 2 / e
                cells += 1
            elif counts[a, b] > 0:
                return math.inf  # a pair the grammar refuses
    df = cells - 1
    return ((chi / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))


N = 60_000


def test_pruned_and_masked_speculation_is_constrained_sampling():
    assert _z(*_draws(N, prune_drafts, mask_before=True)) < 4.0


def _cut_refused(drafts, constrained):
    """Planted bug: a refused token of a sampled draft is dropped, not kept as a sure rejection."""
    out = {}
    for rid, d in drafts.items():
        n = constrained[rid][0].valid_prefix(d.tokens)
        if n:
            out[rid] = d.subset(list(range(n)))
    return out


@pytest.mark.parametrize("prune, mask_before", [(_cut_refused, True), (prune_drafts, False)],
                         ids=["refused-token-cut", "mask-after-rejection"])
def test_planted_bugs_fail(prune, mask_before):
    assert _z(*_draws(N, prune, mask_before)) > 6.0
