"""A draft model's catch-up (the tokens its KV has not seen: a prompt it did not follow, tokens decoded
while it did not draft) is priced: the cost model measures its seconds per row and converts them to
the tokens a row costs the batch; the automatic drafter runs the model for a sequence only where its
draft is expected to give more than its catch-up costs; a drafting step's measured yield pays the
catch-up it ran, but for a probe's catch-up of the plain steps before it, a one-off of switching
drafting back on (docs/decisions.md#catchup-price, #probe-catchup)."""
import itertools

import pytest

from specserve.drafters.auto import AutoDrafter, pays_catchup
from specserve.drafters.base import Drafter, Proposal
from specserve.speculative import CostModel, SpeculativeDecoder
from specserve.speculative.policies import make_policy
from specserve.types import Draft, Request, RequestStatus, SamplingParams


def _decoding(rid: str, max_tokens: int = 64) -> Request:
    r = Request(rid, [5, 6, 7], SamplingParams(temperature=0, max_tokens=max_tokens))
    r.output_token_ids = [8]
    r.status, r.num_computed_tokens = RequestStatus.RUNNING, 3
    return r


def test_pays_catchup_is_the_formula():
    for rows, price, gain in itertools.product([0, 1, 10, 130], [0.01, 0.05, 0.15, 0.25], [0.0, 0.5, 2.0, 5.0]):
        assert pays_catchup(rows, price, gain) == (rows * price <= gain)
    assert pays_catchup(10 ** 6, None, 0.0)  # price unknown: the model runs, as before pricing


class Behind(Drafter):
    """A draft model whose KV lags each request by `lag[rid]` tokens."""

    def __init__(self, lag):
        self.lag, self.asked = lag, []

    def catchup_rows(self, request):
        return self.lag[request.request_id]

    def propose(self, requests, max_len, min_confidence=None, tree=None):
        self.asked.append([r.request_id for r in requests])
        return Proposal([Draft([7] * max_len, None, [0.9] * max_len) for _ in requests], max_len, len(requests),
                        sum(self.lag[r.request_id] for r in requests))


class NoFree(Drafter):
    def propose(self, requests, max_len, min_confidence=None, tree=None):
        return Proposal([Draft() for _ in requests])


def test_the_model_drafts_only_where_its_draft_pays_for_the_catchup():
    model = Behind({"synced": 2, "prompt": 130})
    auto = AutoDrafter([NoFree()], model)
    reqs = [_decoding("synced"), _decoding("prompt")]
    # the model promises 0.6 + 0.36 + 0.216 = 1.18 tokens (prior alpha 0.6, 3 tokens)
    auto.set_catchup_price(None)  # unknown: both, as before pricing
    auto.propose(reqs, 3)
    assert model.asked[-1] == ["synced", "prompt"]
    auto.set_catchup_price(0.05)  # 2 rows cost 0.1 tokens, 130 rows 6.5: more than the draft gives
    p = auto.propose(reqs, 3)
    assert model.asked[-1] == ["synced"]
    assert p.drafts[0].tokens == [7, 7, 7] and p.drafts[1].tokens == []
    assert auto.catchup_rows(reqs[1]) == 130
    auto.set_catchup_price(0.005)  # at batch 1's price a prompt's catch-up pays (0.65 < 1.18)
    auto.propose(reqs, 3)
    assert model.asked[-1] == ["synced", "prompt"]


def test_catchup_price_is_a_rows_seconds_at_the_batch_plain_token_rate():
    c = CostModel()
    for rows, t in [(1, 10e-3), (2, 11e-3), (4, 12e-3), (8, 14e-3), (16, 18e-3), (32, 26e-3), (64, 42e-3)]:
        c.record_calibration(rows, t)
    c.record_draft(1, 4e-3)
    # before a catch-up is timed: the draft's one-row step scaled as the target's 64-row pass per row
    # is to its one-row pass (42 / 64 / 10 of a one-row pass per row)
    assert c.catchup_row_seconds() == pytest.approx(4e-3 * 42e-3 / (64 * 10e-3))
    c.record_catchup(100, 0.12)
    assert c.catchup_row_seconds() == pytest.approx(1.2e-3)
    for _ in range(3):
        c.record_target(4, 40e-3, batch=4)  # plain steps of 4 sequences: 100 tokens/s
    assert c.catchup_price(4) == pytest.approx(1.2e-3 * 100)
    c.record_catchup(50, 0.05)  # a moving average, as the other timings
    assert 1.0e-3 < c.catchup_row_seconds() < 1.2e-3


class CatchingUp(Drafter):
    """A model drafter whose drafting step first catches up on 40 rows per request, taking `catchup` s."""

    def __init__(self, catchup):
        self.catchup, self.prices = catchup, []

    def set_catchup_price(self, tokens_per_row):
        self.prices.append(tokens_per_row)

    def propose(self, requests, max_len, min_confidence=None, tree=None):
        return Proposal([Draft([1, 2], None, [0.9, 0.9]) for _ in requests], model_passes=2,
                        model_batch=len(requests), catchup_rows=40 * len(requests), catchup_seconds=self.catchup)


def test_a_drafting_step_pays_the_catchup_it_ran_and_times_it():
    spec = SpeculativeDecoder(CatchingUp(0.05), lambda: make_policy("fixed", 2), fallback=False)
    spec.costs.record_draft(1, 1e-3)  # a steady draft step: 1 ms
    spec.propose([_decoding("a")])
    spec.record_step(3, 20e-3, 18e-3, 1, 1, 2)
    t = spec.costs.draft_step_seconds(1)  # the steady step (capped by this probe's passes, which took microseconds)
    tokens, t_draft, t_step = spec.costs.yields[1, "chain"]
    assert t_draft == pytest.approx(2 * t + (0.05 - t))  # two steady passes and the catch-up beyond one
    assert spec.costs.catchup_row_seconds() == pytest.approx(0.05 / 40)


def test_the_decoder_tells_the_drafter_the_batch_price():
    drafter = CatchingUp(0.0)
    spec = SpeculativeDecoder(drafter, lambda: make_policy("fixed", 2))
    for rows, t in [(1, 10e-3), (2, 11e-3), (4, 12e-3), (8, 14e-3), (16, 18e-3)]:
        spec.costs.record_calibration(rows, t)
    spec.costs.record_catchup(100, 0.1)
    for _ in range(3):
        spec.costs.record_target(2, 20e-3, batch=2)
    spec.propose([_decoding("a"), _decoding("b")])
    assert drafter.prices == [pytest.approx(1e-3 * 2 / 20e-3)]


def test_a_probe_does_not_pay_the_catchup_of_the_plain_steps_before_it():
    """The first drafting step after a run of plain steps (a probe) catches the draft up on the tokens
    they decoded. Paid by the probe's yield, every probe looked to lose (16 plain steps' catch-up cost
    about a target step at batch 1), so drafting, once off, stayed off: 112 plain steps of 119 on a
    chat prompt. The probe's yield is a steady step's: two draft passes, no catch-up."""
    spec = SpeculativeDecoder(CatchingUp(0.05), lambda: make_policy("fixed", 2))
    for rows, t in [(1, 10e-3), (2, 11e-3), (3, 11.5e-3), (4, 12e-3), (8, 14e-3), (16, 18e-3)]:
        spec.costs.record_calibration(rows, t)
    spec.costs.record_draft(1, 1e-3)
    for _ in range(3):
        spec.costs.record_target(1, 10e-3, batch=1)
    spec.costs.record_yield(1, 1.0, 5e-3, 20e-3)  # drafting measured to lose: plain steps follow
    r = _decoding("a")
    for _ in range(spec.retry_every):
        assert spec.propose([r]) == {}
        spec.record_step(1, 10e-3, 10e-3, 1, 1, 1)
    assert spec.propose([r])["a"].tokens == [1, 2]  # the probe
    spec.record_step(3, 20e-3, 18e-3, 1, 1, 2)
    t = spec.costs.draft_step_seconds(1)
    tokens, t_draft, t_step = spec.costs.yields[1, "chain"]
    assert t_draft == pytest.approx(0.5 * 5e-3 + 0.5 * 2 * t)  # a probe weighs 0.5; its catch-up left out
