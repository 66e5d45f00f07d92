import pytest
import torch

from specserve import SamplingParams, kernels
from specserve.sampling.sampler import _draw_cumsum, draw, draw_many, make_generator, sample, warp_logits


def test_top_k_and_top_p_keep_the_right_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    p = warp_logits(logits, SamplingParams(temperature=1.0, top_k=2))
    torch.testing.assert_close(p, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    p = warp_logits(logits, SamplingParams(temperature=1.0, top_p=0.8))  # 0.5 + 0.3 reaches 0.8
    torch.testing.assert_close(p, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    p = warp_logits(logits, SamplingParams(temperature=1.0, top_p=0.81))  # needs the third token
    assert (p[0, :3] > 0).all() and p[0, 3] == 0


def test_greedy_and_logprobs():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 0.0]])
    toks, (lps, tops) = sample(logits, [SamplingParams(temperature=0, logprobs=2), SamplingParams(temperature=0, logprobs=True)],
                               [None, None])
    assert toks == [1, 0]
    lsm = torch.log_softmax(logits, -1)
    torch.testing.assert_close(torch.tensor(lps), lsm[[0, 1], [1, 0]])
    assert list(tops[0]) == [1, 2] and abs(tops[0][2] - lsm[0, 2].item()) < 1e-6  # the 2 most likely, best first
    assert sample(logits, [SamplingParams(temperature=0)] * 2, [None, None])[1] is None  # nobody asked


def test_same_seed_same_tokens_and_frequencies_follow_probs():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]]))
    params = [SamplingParams(temperature=1.0)]
    draws = lambda seed: [sample(logits, params, [g])[0][0]
                          for g in [make_generator(seed, torch.device("cpu"))] for _ in range(2000)]
    a, b = draws(5), draws(5)
    assert a == b
    freq = torch.bincount(torch.tensor(a), minlength=3).float() / len(a)
    # 2000 draws: standard error ~0.01, so 0.05 is > 4 sigma
    assert torch.allclose(freq, torch.tensor([0.7, 0.2, 0.1]), atol=0.05)


def test_top_p_from_the_likeliest_candidates_equals_a_full_sort():
    """warp_logits takes the nucleus from the top TOP_P_CANDIDATES tokens, sorting the whole vocabulary
    only for rows whose nucleus reaches past them: the same kept tokens and probabilities as a sort."""
    def reference(probs, top_p):  # the plain way: sort everything
        vals, order = torch.sort(probs, dim=-1, descending=True)
        drop = (torch.cumsum(vals, dim=-1) - vals) >= top_p
        kept = torch.zeros_like(probs).scatter_(-1, order, vals.masked_fill(drop, 0.0))
        return kept / kept.sum(dim=-1, keepdim=True)

    g = torch.Generator().manual_seed(0)
    peaked = torch.randn(6, 49152, generator=g) * 4  # nucleus of a few hundred tokens: the candidates hold it
    flat = torch.randn(2, 49152, generator=g) * 0.1  # nucleus of ~45k tokens: the full sort
    for logits in (peaked, flat, torch.cat([peaked[:3], flat[:1]])):
        for top_p in (0.5, 0.9, 0.95):
            got = warp_logits(logits, SamplingParams(temperature=0.8, top_p=top_p))
            want = reference(torch.softmax(logits / 0.8, dim=-1), top_p)
            assert torch.equal(got > 0, want > 0)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-9)


def _rows(V: int, n: int, seed: int) -> torch.Tensor:
    """n unnormalised rows of V masses, about half of them zero (as after top-k / top-p)."""
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(n, V, generator=g) ** 4 * 7.0
    return p.masked_fill(torch.rand(n, V, generator=g) < 0.5, 0.0)


@pytest.mark.skipif(not kernels.available(), reason="the blocked draw is a kernel")
@pytest.mark.parametrize("V", [1, 5, 64, 65, 1000, 262144])
def test_the_blocked_draw_gives_the_sequential_cumsums_token(V):
    """draw_rows (block sums, then one block walked) against the plain inverse CDF over torch's
    sequential double cumsum, row for row, including u at 0 and just under 1."""
    probs = _rows(V, 24, V)
    u = torch.rand(24, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    u[0], u[1] = 0.0, 1.0 - 2.0 ** -53
    ours = kernels.ext().draw_rows(probs, u).tolist()
    assert ours == [_draw_cumsum(p, ur) for p, ur in zip(probs, u)]
    assert all(probs[r, t] > 0 for r, t in enumerate(ours) if probs[r].sum() > 0)


@pytest.mark.skipif(not kernels.available(), reason="the blocked draw is a kernel")
def test_the_blocked_draw_never_lands_on_a_token_without_mass():
    """u * total exactly on a boundary: the token after the boundary's zeros, never a zero; a row of
    zeros gives the last token, as the plain form does."""
    V = 200
    probs = torch.zeros(3, V)
    probs[0, [10, 64, 130]] = torch.tensor([1.0, 1.0, 2.0])  # boundaries at 1/4 and 1/2 of the mass
    probs[1, [63, 64]] = 1.0  # either side of the first block's end
    u = torch.tensor([0.25, 0.5, 0.7], dtype=torch.float64)
    assert kernels.ext().draw_rows(probs, u).tolist() == [64, 64, V - 1]
    assert [_draw_cumsum(p, ur) for p, ur in zip(probs, u)] == [64, 64, V - 1]


def test_draw_many_follows_each_rows_generator():
    """Each row's token comes from its own generator's next uniform, whatever the rows beside it."""
    probs = _rows(3000, 4, 7)
    alone = [draw(probs[r], make_generator(r, torch.device("cpu"))) for r in range(4)]
    together = draw_many(probs, [make_generator(r, torch.device("cpu")) for r in range(4)])
    assert alone == together
    freq = torch.bincount(torch.tensor(draw_many(probs[:1].expand(4000, -1).contiguous(), [None] * 4000)), minlength=3000)
    expected = probs[0] / probs[0].sum() * 4000
    assert ((freq - expected).abs() <= 5 * expected.sqrt() + 3).all()  # within ~5 sigma token by token
