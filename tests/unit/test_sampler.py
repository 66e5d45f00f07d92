import torch

from specserve import SamplingParams
from specserve.sampling.sampler import make_generator, sample, warp_logits


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
