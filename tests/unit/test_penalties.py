"""Penalties (sampling/penalties.py) and min-p (sampler.warp_logits) against plain per-token references."""
import math

import pytest
import torch

from specserve import SamplingParams
from specserve.sampling.penalties import PenaltySpan, apply_penalties
from specserve.sampling.sampler import warp_logits


def reference_row(logits: list[float], p: SamplingParams, prompt: list[int], output: list[int]) -> list[float]:
    """One row by the formulas, token by token, as HF's RepetitionPenaltyLogitsProcessor and OpenAI's
    presence / frequency penalties read."""
    out = []
    for v, x in enumerate(logits):
        c = output.count(v)
        if v in prompt or c:
            x = x * p.repetition_penalty if x < 0 else x / p.repetition_penalty
        out.append(x - p.frequency_penalty * c - p.presence_penalty * (c > 0))
    return out


PARAMS = [SamplingParams(repetition_penalty=1.3), SamplingParams(presence_penalty=0.7),
          SamplingParams(frequency_penalty=-0.4), SamplingParams(repetition_penalty=0.8, presence_penalty=-1.5, frequency_penalty=2.0)]


@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.parametrize("parents", [None, [-1, 0, 1, 2], [-1, -1, 0, 1, 0]])  # no draft, a chain, a tree
def test_each_row_is_penalised_for_the_tokens_before_it(params, parents):
    """A verify span's row j + 1 counts the draft tokens from the root down to j: the row a one-token
    step after those tokens would get, bit for bit."""
    V = 12
    g = torch.Generator().manual_seed(0)
    prompt, output = [1, 4, 4, 9], [4, 2, 2, 7]
    draft = [] if parents is None else [3, 2, 11, 3, 0][:len(parents)]
    paths = []
    for t, par in zip(draft, parents or []):
        paths.append((paths[par] if par >= 0 else ()) + (t,))
    end = 3 + 1 + len(draft)
    logits = torch.randn(end + 2, V, generator=g) * 3  # rows of other requests around the span
    logits[3, 4] = float("-inf")  # a token a grammar or a bias banned stays banned
    logits[3, 2] = 0.0
    before = logits.clone()
    apply_penalties(logits, [PenaltySpan(3, params, prompt, output, paths)])
    assert torch.equal(logits[:3], before[:3]) and torch.equal(logits[end:], before[end:])
    for j, path in enumerate([()] + paths):
        want = reference_row(before[3 + j].tolist(), params, prompt, output + list(path))
        assert logits[3 + j].tolist() == pytest.approx(want, rel=1e-6, abs=1e-6), j
        one = before[3 + j:4 + j].clone()  # the same row alone, its path as output: the same bits
        apply_penalties(one, [PenaltySpan(0, params, prompt, output + list(path))])
        assert torch.equal(one[0], logits[3 + j]), j
    assert logits[3, 4] == float("-inf")


def test_a_steps_spans_are_penalised_as_each_alone():
    """One call over several requests' spans (other params, other tokens) gives each span the bits it
    gets alone."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(9, 40, generator=g)
    spans = [PenaltySpan(0, PARAMS[3], [1, 2, 3], [5, 5, 6], [(7,), (7, 8)]), PenaltySpan(3, PARAMS[1], [9], [9, 10]),
             PenaltySpan(4, PARAMS[0], [11, 12], [], [(13,), (13, 11), (13, 11, 2)]), PenaltySpan(8, SamplingParams(), [1], [1])]
    together = logits.clone()
    apply_penalties(together, spans)
    for s in spans:
        rows = slice(s.first, s.first + 1 + len(s.paths))
        alone = logits[rows].clone()
        apply_penalties(alone, [PenaltySpan(0, s.params, s.prompt, s.output, s.paths)])
        assert torch.equal(alone, together[rows]), s.first
    assert not torch.equal(together[:8], logits[:8]) and torch.equal(together[8], logits[8])


def test_off_penalties_leave_every_bit():
    x = torch.randn(2, 50)
    y = x.clone()
    apply_penalties(y, [PenaltySpan(0, SamplingParams(repetition_penalty=1.0), [1, 2], [3], [(4,)])])
    assert torch.equal(x, y) and not SamplingParams().penalized and SamplingParams(presence_penalty=0.1).penalized


def test_min_p_keeps_tokens_at_least_min_p_times_the_likeliest():
    probs = torch.tensor([[0.5, 0.3, 0.12, 0.08]])
    for min_p, kept in [(0.2, 3), (0.15, 4), (0.61, 1), (0.0, 4)]:
        p = warp_logits(torch.log(probs), SamplingParams(temperature=1.0, min_p=min_p))
        assert int((p > 0).sum()) == kept, min_p
        torch.testing.assert_close(p[0, :kept], probs[0, :kept] / probs[0, :kept].sum())
    # after temperature: at T = 0.5 the probabilities square (0.25 : 0.09 : 0.0144 : 0.0064, over 0.3608)
    p = warp_logits(torch.log(probs), SamplingParams(temperature=0.5, min_p=0.3))
    assert int((p > 0).sum()) == 2
    # before top-p: min-p drops the tail, then top-p's nucleus is taken of what is left
    p = warp_logits(torch.log(probs), SamplingParams(temperature=1.0, min_p=0.2, top_p=0.9))
    assert int((p > 0).sum()) == 3 and math.isclose(p[0, 0].item(), 0.5 / 0.92, rel_tol=1e-5)


@pytest.mark.parametrize("kw, match", [
    (dict(presence_penalty=2.5), "presence_penalty must be a number in"),
    (dict(frequency_penalty=-3), "frequency_penalty must be a number in"),
    (dict(frequency_penalty="1"), "frequency_penalty"),
    (dict(repetition_penalty=0), "repetition_penalty must be a finite number > 0"),
    (dict(repetition_penalty=float("inf")), "repetition_penalty"),
    (dict(min_p=1.5), "min_p must be in"),
    (dict(min_p=float("nan")), "min_p"),
])
def test_out_of_range_is_refused_in_one_line(kw, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kw)
