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


def test_min_tokens_holds_the_stop_ids_back_in_the_rows_short_of_it():
    """Output of 2 tokens, min_tokens 4: the rows after 0 and 1 draft tokens may not stop, the rows
    after 2 and 3 may (a chain of 3 drafts: rows of depth 0..3)."""
    logits = torch.randn(4, 10)
    before = logits.clone()
    apply_penalties(logits, [PenaltySpan(0, SamplingParams(min_tokens=4), [1], [5, 6], [(2,), (2, 7), (2, 7, 3)], stop_ids=[0, 9])])
    assert (logits[:2, [0, 9]] == float("-inf")).all()
    assert torch.equal(logits[:2, 1:9], before[:2, 1:9]) and torch.equal(logits[2:], before[2:])


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
    # after temperature: at T = 0.5 the probabilities square (0.693, 0.249, 0.040, 0.018): 0.5 of the
    # likeliest keeps one token (before temperature it would keep two: 0.3 >= 0.25)
    p = warp_logits(torch.log(probs), SamplingParams(temperature=0.5, min_p=0.5))
    assert int((p > 0).sum()) == 1
    # before top-p: min-p leaves (0.543, 0.326, 0.130), whose nucleus of 0.85 is two tokens (top-p first
    # would keep three: 0.5 + 0.3 < 0.85, and min-p would then keep them all)
    p = warp_logits(torch.log(probs), SamplingParams(temperature=1.0, min_p=0.2, top_p=0.85))
    assert int((p > 0).sum()) == 2 and math.isclose(p[0, 0].item(), 0.5 / 0.8, rel_tol=1e-5)


@pytest.mark.parametrize("kw, match", [
    (dict(presence_penalty=2.5), "presence_penalty must be a number in"),
    (dict(frequency_penalty=-3), "frequency_penalty must be a number in"),
    (dict(frequency_penalty="1"), "frequency_penalty"),
    (dict(repetition_penalty=0), "repetition_penalty must be a finite number > 0"),
    (dict(repetition_penalty=float("inf")), "repetition_penalty"),
    (dict(min_p=1.5), "min_p must be in"),
    (dict(min_p=float("nan")), "min_p"),
    (dict(min_tokens=-1), "min_tokens must be an integer in"),
    (dict(min_tokens=9, max_tokens=8), "min_tokens must be an integer in"),
    (dict(min_tokens=2, guided_regex="a+"), "min_tokens cannot be combined with guided"),
    (dict(allowed_token_ids=[]), "allowed_token_ids must be a non-empty list"),
    (dict(allowed_token_ids="12"), "allowed_token_ids must be a non-empty list"),
    (dict(allowed_token_ids=[3, -1]), "allowed_token_ids must be a non-empty list"),
    (dict(include_stop_str_in_output="yes"), "include_stop_str_in_output must be True or False"),
])
def test_out_of_range_is_refused_in_one_line(kw, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kw)


@pytest.mark.parametrize("reduced", [False, True])
def test_the_draft_picker_proposes_the_penalised_choice(reduced):
    """A penalised request's draft logits are penalised too, its draft tokens so far counted as output
    (in a reduced draft vocabulary, by their draft columns): the picker's greedy token is the argmax of
    the penalised row, where the unpenalised argmax would be a token the penalty pushes down."""
    from specserve.drafters.common import DraftPicker
    from specserve.types import Request
    V = 20
    vocab_ids = torch.tensor([0, 3, 5, 7, 9, 11, 13]) if reduced else None
    picker = DraftPicker(V, torch.device("cpu"), vocab_ids)
    width = len(vocab_ids) if reduced else V
    logits = torch.zeros(2, width)
    top, second = (1, 2) if reduced else (3, 5)  # columns of target tokens 3 and 5
    logits[:, top], logits[:, second] = 2.0, 1.9
    params = SamplingParams(temperature=0, repetition_penalty=1.5)
    reqs = [Request("a", [1, 2], params), Request("b", [1, 2], SamplingParams(temperature=0))]
    reqs[0].output_token_ids = [9]
    tokens, _, _ = picker.pick(reqs, logits, [[3], [3]])  # token 3 was drafted just before
    assert tokens == [5, 3]  # penalised: 2.0 / 1.5 < 1.9; the other request is not
    assert logits[0, top] == 2.0  # the caller's logits are left alone
    tokens, _, _ = picker.pick(reqs, logits, [[], []])
    assert tokens == [3, 3]
