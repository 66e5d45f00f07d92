"""The rejection sampler is lossless: emitted tokens follow the target distribution exactly.

Synthetic p and q over a small vocabulary, 2 x 10^5 draws; every histogram bin must lie within
5 standard deviations (sqrt(p (1 - p) / N)) of p. Planted bugs must make the same check fail."""
import pytest
import torch

from specserve.sampling import rejection
from specserve.sampling.rejection import rejection_sample, verify_greedy

N, V, K = 200_000, 6, 3


def _dists(seed):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(K + 1, V, generator=g) * 1.5, -1)  # target at positions 0..K
    q = torch.softmax(torch.randn(K, V, generator=g) * 1.5, -1)  # draft at positions 0..K-1
    return p, q


def _run(p, q, seed=1, deterministic_draft=False):
    g = torch.Generator().manual_seed(seed)
    if deterministic_draft:  # prompt lookup: a fixed proposal, q = one-hot
        drafts = torch.tensor([[1, 4, 2]]).repeat(N, 1)
        qb = None
    else:
        drafts = torch.stack([torch.multinomial(q[i], N, replacement=True, generator=g) for i in range(K)], 1)
        qb = q[None].expand(N, K, V)
    num, nxt = rejection_sample(p[None].expand(N, K + 1, V), qb, drafts, torch.full((N,), K), g)
    first = torch.where(num >= 1, drafts[:, 0], nxt)
    # Given the first draft was accepted, the second emitted token must follow p[1].
    second = torch.where(num >= 2, drafts[:, 1], nxt)[num >= 1]
    return first, second, num


def _within(tokens, p, sigmas=5.0):
    n = len(tokens)
    freq = torch.bincount(tokens, minlength=V).double() / n
    tol = sigmas * torch.sqrt(p.double() * (1 - p.double()) / n) + 1e-4
    return bool(((freq - p.double()).abs() <= tol).all()), (freq - p.double()).abs().max().item()


@pytest.mark.parametrize("deterministic", [False, True])
def test_output_follows_target(deterministic):
    p, q = _dists(0)
    first, second, num = _run(p, q, deterministic_draft=deterministic)
    ok1, err1 = _within(first, p[0])
    ok2, err2 = _within(second, p[1])
    assert ok1 and ok2, (err1, err2)
    assert 0 < num.float().mean() < K  # both acceptance and rejection happen


def test_all_accepted_gives_bonus_from_last_target():
    p, _ = _dists(3)
    q = p[:K].clone()  # a perfect draft is always accepted
    _, _, num = _run(p, q)
    assert bool((num == K).all())
    g = torch.Generator().manual_seed(5)
    drafts = torch.zeros(N, K, dtype=torch.long)
    _, nxt = rejection_sample(p[None].expand(N, K + 1, V), p[None, :K].expand(N, K, V), drafts, torch.full((N,), 0), g)
    assert _within(nxt, p[0])[0]  # no drafts: a plain sample from p


@pytest.mark.parametrize("bug", ["no_normalisation", "no_clamp", "target_instead_of_residual"])
def test_planted_bugs_are_caught(bug, monkeypatch):
    planted = {
        "no_normalisation": lambda p, q: (p - q).clamp(min=0),
        "no_clamp": lambda p, q: (p - q) / (p - q).sum(-1, keepdim=True),
        "target_instead_of_residual": lambda p, q: p,
    }[bug]
    monkeypatch.setattr(rejection, "residual_distribution", planted)
    p, q = _dists(0)
    first, _, _ = _run(p, q)
    assert not _within(first, p[0])[0]


def test_seeded_and_batch_independent():
    p, q = _dists(7)
    B = 4
    drafts = torch.tensor([[0, 1, 2]]).repeat(B, 1)
    args = (p[None].expand(B, K + 1, V), q[None].expand(B, K, V), drafts, torch.full((B,), K))
    a = rejection_sample(*args, [torch.Generator().manual_seed(s) for s in range(B)])
    b = rejection_sample(*args, [torch.Generator().manual_seed(s) for s in range(B)])
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    # Sequence 2 alone draws the same as inside the batch.
    c = rejection_sample(p[None], q[None], drafts[:1], torch.tensor([K]), [torch.Generator().manual_seed(2)])
    assert (int(c[0]), int(c[1])) == (int(a[0][2]), int(a[1][2]))


def test_greedy_prefix_and_next_token():
    best = [[5, 6, 7, 8], [5, 6, 7, 8], [1, 2]]
    logits = []
    for b in best:
        rows = torch.full((len(b), 10), -1.0)
        rows[torch.arange(len(b)), torch.tensor(b)] = 1.0
        logits.append(rows)
    drafts = [[5, 6, 9], [5, 6, 7], [1]]
    # ragged spans: the third sequence verifies a single draft
    assert verify_greedy(logits, drafts) == [(2, 7), (3, 8), (1, 2)]
    assert verify_greedy([logits[0][:1]], [[]]) == [(0, 5)]  # no drafts: the target's own token


def test_verify_mixes_deterministic_and_sampled_drafts_in_one_batch():
    """lookup+draft: one sequence's draft came from prompt lookup (q = one-hot, no probs), another's
    from the draft model (q = probs). Each is judged by its own q in one batched verification."""
    from specserve.speculative import verify
    from specserve.types import Draft, SamplingParams

    V = 6
    params = SamplingParams(temperature=1.0, max_tokens=8)
    q = torch.zeros(2, V)
    q[0, 5] = q[1, 0] = 1.0  # the draft model was sure of its tokens too
    det = Draft([3, 4], None, [1.0, 1.0])
    sam = Draft([5, 0], q, [1.0, 1.0])

    def sure_of(*tokens):  # logits rows putting (almost) all mass on these tokens
        rows = torch.full((len(tokens), V), -30.0)
        rows[torch.arange(len(tokens)), torch.tensor(tokens)] = 30.0
        return rows

    gens = [torch.Generator().manual_seed(i) for i in range(2)]
    out = verify([det, sam], [sure_of(3, 4, 2), sure_of(5, 1, 2)], [params, params], gens, [False, False])
    assert (out[0].num_accepted, out[0].tokens) == (2, [3, 4, 2])  # both lookup drafts accepted, bonus token 2
    assert (out[1].num_accepted, out[1].tokens) == (1, [5, 1])  # the model's second draft (0) rejected, the target's 1
    assert det.tokens == [3, 4] and sam.tokens == [5, 0]  # verification is pure: the drafts stay as they were
    assert [v.path for v in out] == [(0, 1), (0,)] and [v.rows for v in out] == [(0, 1, 2), (0, 1)]
