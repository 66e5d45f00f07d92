"""Draft-length policies (BASS Algorithm 1 by hand), the cost model's choice, and prompt lookup."""
import pytest
import torch

from specserve.drafters.prompt_lookup import PromptLookupDrafter
from specserve.speculative import CostModel
from specserve.speculative.policies import BassPolicy, FixedPolicy, ThresholdPolicy, make_policy
from specserve.types import Request, SamplingParams


def verify_and_learn(spec, reqs, drafts, logits, generators=None):
    """The engine's verify-then-learn for requests drafted `drafts`, on their logits spans."""
    from specserve.speculative import StepResult, VerifiedDraft, verify
    from specserve.speculative.verify import is_seeded
    results = verify(drafts, logits, [r.params for r in reqs], generators or [None] * len(reqs),
                     [is_seeded(r.params, r.seed) for r in reqs], spec.tree.top_k, spec.wants_span_argmax)
    spec.learn(StepResult([VerifiedDraft(r, d, v) for r, d, v in zip(reqs, drafts, results)], []))
    return results


def _decoding(rid: str) -> "Request":
    """A greedy request whose prompt is computed and which decodes its next token this step."""
    from specserve.types import RequestStatus
    r = Request(rid, [5, 6, 7], SamplingParams(temperature=0, max_tokens=64))
    r.output_token_ids = [8]
    r.status, r.num_computed_tokens = RequestStatus.RUNNING, 3
    return r


def test_bass_algorithm_1_by_hand():
    p = BassPolicy()  # l0=7, l_incre=2, l_mod=10, l_limit=32
    assert p.draft_len() == 7
    p.update([7, 7], [7, 3])  # someone accepted all: grow, s = 0
    assert (p.l, p.s) == (9, 0)
    p.update([9, 9], [2, 4])  # l = 9 - ceil(0.9) - 0 = 8; max(1, 2, 4, 8) = 8; s = 1
    assert (p.l, p.s) == (8, 1)
    p.update([8], [1])  # l = 8 - 1 - 1 = 6
    assert p.l == 6
    p.update([6], [5])  # l = 6 - 1 - 1 = 4, but never below the longest accepted run: 5
    assert p.l == 5
    for _ in range(20):
        p.update([p.l], [p.l])
    assert p.l == 32  # l_limit


def test_threshold_moves_toward_last_accepted_and_clamps():
    p = ThresholdPolicy(threshold=0.5, rate=0.5)
    p.update([3], [1], [[0.9, 0.4, 0.8]])  # accepted prefix prob 0.9: 0.5 + 0.5 * (0.9 - 0.5)
    assert p.min_confidence == pytest.approx(0.7)
    p.update([2], [2], [[0.9, 0.9]])  # all accepted: lower a little
    assert p.min_confidence == pytest.approx(0.7 + 0.5 * (0.65 - 0.7))
    for _ in range(50):
        p.update([2], [0], [[0.99, 0.5]])  # nothing accepted: target 1.0, clamped at 0.95
    assert p.min_confidence == pytest.approx(0.95, abs=1e-6)
    assert p.draft_len() == 8


def test_make_policy_maps_draft_len():
    assert make_policy("fixed", 3).draft_len() == 3 and make_policy("fixed", "auto").draft_len() == 4
    assert make_policy("bass", 5).draft_len() == 5 and make_policy("threshold", 6).draft_len() == 6
    with pytest.raises(ValueError, match="unknown draft-length policy"):
        make_policy("medusa", "auto")
    assert isinstance(make_policy("fixed", 2), FixedPolicy)


def test_cost_model_prefers_plain_decoding_when_verification_is_dear():
    c = CostModel()
    for rows, ms in {1: 10, 2: 12, 3: 15, 5: 21, 8: 30}.items():
        c.record_target(rows, ms / 1e3)
    c.record_draft(1, 1e-3)
    c.record_acceptance(accepted=0, rejections=10)  # alpha 0: drafts never pay
    assert max(range(5), key=lambda k: c.tokens_per_second(1, k)) == 0
    c2 = CostModel()
    c2.target, c2.draft = dict(c.target), dict(c.draft)
    c2.record_acceptance(accepted=90, rejections=10)  # alpha 0.9
    best = max(range(5), key=lambda k: c2.tokens_per_second(1, k))
    assert best >= 2
    # 1 + 0.9 + 0.81 tokens for 15 ms + 2 draft ms, against 1 token per 10 ms
    assert c2.tokens_per_second(1, 2) == pytest.approx(2.71 / 0.017)


def test_cost_model_adds_measured_overhead_to_calibrated_passes():
    c = CostModel()
    for rows, ms in {1: 10, 4: 16, 8: 28}.items():
        c.record_calibration(rows, ms / 1e3)
    c.record_target(1, 13e-3)  # whole steps cost 3 ms more than the bare pass
    assert c.step_seconds(4) == pytest.approx(19e-3)
    assert c.step_seconds(6) == pytest.approx(25e-3)


def test_step_curve_scales_calibration_by_what_steps_of_the_batch_size_measure():
    c = CostModel()
    for rows, ms in {1: 10, 2: 13, 4: 19, 8: 31}.items():
        c.record_calibration(rows, ms / 1e3)
    c.record_calibration(12, 25e-3)  # cheaper than 8 rows: noise, clamped to the 8-row pass
    assert c.calibrated[12] == pytest.approx(31e-3)
    c.record_target(1, 15e-3, batch=1)  # the machine runs 1.5x slower than at calibration
    assert c.step_seconds(2, 1) == pytest.approx(19.5e-3)
    assert c.step_curve(1, 4, 1) == pytest.approx([15e-3, 19.5e-3, 24e-3, 28.5e-3])
    c.record_target(400, 2.0, batch=1)  # a prefill: beyond the calibration, not a decode step's cost
    assert c.scale[1] == pytest.approx(1.5)
    # no batch-4 step yet: the bare pass plus what measured steps cost beyond theirs (15 - 10 ms)
    assert c.step_seconds(8, 4) == pytest.approx(36e-3)
    # a quick verify step of 4 rows at batch 2 does not make 4 rows look cheaper than 2 at batch 4
    c.record_target(4, 12e-3, batch=2)
    curve = c.step_curve(2, 4, 4)
    assert curve[0] < curve[1] < curve[2]  # (the single step read directly: 12, 15, 12 ms)


def test_break_even_confidence_from_measured_costs():
    c = CostModel()
    for rows, ms in {1: 10, 2: 13, 8: 30, 16: 54}.items():
        c.record_target(rows, ms / 1e3)
    # before a draft step is timed: a guess of a tenth of a one-row step (1 ms)
    assert c.break_even_confidence(1) == pytest.approx((3 + 1) / 10)
    c.record_draft(1, 2e-3)
    c.record_draft(8, 2e-3)
    # batch 1: a row (3 ms) + a draft step (2 ms) against 10 ms per token
    assert c.break_even_confidence(1) == pytest.approx(0.5)
    # batch 8: 8 rows (24 ms) + a draft step (2 ms) against 30 ms for 8 tokens
    assert c.break_even_confidence(8) == pytest.approx(26 / 30)


def test_selection_keeps_the_prefix_that_pays_on_the_measured_curve():
    import torch

    from specserve.speculative import select_drafts
    from specserve.types import Draft
    q = torch.eye(4)[:3]
    d = Draft([5, 6, 7], q, [0.9, 0.8, 0.9])  # cumulative 0.9, 0.72, 0.648
    line = [10 + 3 * n for n in range(4)]  # ms: every row costs 3, i.e. 0.3 of a plain token
    # every token is likelier than 0.3: all three verified
    assert select_drafts([d], line)[0] is d
    # a cliff at the third row (as past the block kernel's row limit): one token only
    cut = select_drafts([d], [10, 13, 40, 43])[0]
    assert cut.tokens == [5] and cut.confidence == [0.9] and torch.equal(cut.probs, q[:1])
    # rows that cost 1.5 plain tokens never pay
    assert select_drafts([d], [10, 25, 40, 55])[0].tokens == []
    # lookup tokens carry the measured acceptance of a 3-gram match (0.73, then 0.85 each), so long
    # copies get cut where the cumulative chance falls below 0.3: 0.73 * 0.85^5 = 0.32, * 0.85 = 0.28
    r = Request("0", [1, 2, 3] + list(range(10, 30)) + [1, 2, 3], SamplingParams())
    look = PromptLookupDrafter(max_ngram=3).propose([r], 10).drafts[0]
    assert len(look.tokens) == 10 and look.confidence == [0.73] + [0.85] * 9
    assert len(select_drafts([look], [10 + 3 * n for n in range(11)], margin=1.0)[0].tokens) == 6
    # with the default margin (a row must beat 1.1x its cost: 0.33 here) the 0.32 token goes too
    assert len(select_drafts([look], [10 + 3 * n for n in range(11)])[0].tokens) == 5
    # a 1-gram match is a weak guess (a quarter of them are right): not worth a row here
    r1 = Request("1", [7, 40, 41, 42, 7], SamplingParams())
    weak = PromptLookupDrafter(max_ngram=3).propose([r1], 3).drafts[0]
    assert weak.tokens == [40, 41, 42] and weak.confidence[0] == 0.25
    assert select_drafts([weak], [10, 13, 16, 19])[0].tokens == []


def test_rows_beside_a_prompt_chunk_are_priced_at_plain_decodings_token_rate():
    """A step that also carries a prompt chunk starts its curve higher (here 20 ms for 4 decodes and the
    chunk, 10 ms for the decodes alone); a row's 3 ms is worth 1.2 plain tokens at the decodes' rate,
    not 0.6 at the slower rate of the step with the chunk, so a 0.8 draft is cut."""
    from specserve.speculative import select_drafts
    from specserve.types import Draft
    d = Draft([1], None, [0.8])
    curve = [20e-3, 23e-3]
    assert select_drafts([d, Draft(), Draft(), Draft()], curve)[0] is d  # priced at the chunk step's rate
    assert select_drafts([d, Draft(), Draft(), Draft()], curve, plain_seconds=10e-3)[0].tokens == []


def test_selection_is_a_budget_for_the_whole_batch():
    from specserve.speculative import select_drafts
    from specserve.types import Draft
    a = Draft([1, 2], None, [0.95, 0.95])
    b = Draft([3], None, [0.5])
    # two sequences; two more rows are cheap, a third is not: the likely tokens get them
    kept = select_drafts([a, b], [20, 23, 26, 60])
    assert kept[0] is a and kept[1].tokens == []


def test_drafting_pays_compares_what_drafting_steps_yielded():
    c = CostModel()
    for rows, ms in {1: 10, 2: 13, 3: 16, 8: 30, 16: 54}.items():
        c.record_target(rows, ms / 1e3)
    assert c.drafting_pays(1) is None  # nothing measured yet
    c.record_yield(1, tokens=2, draft_seconds=1e-3, step_seconds=13e-3)  # 2 tokens per 14 ms vs 1 per 10 ms
    assert c.drafting_pays(1) is True
    # batch 8 emitting 9 tokens in 52 ms + 2 ms vs 8 per 30 ms
    c.record_yield(8, tokens=9, draft_seconds=2e-3, step_seconds=52e-3)
    assert c.drafting_pays(8) is False
    # measured plain steps of the batch size, not the curve, set the bar: slower plain steps at batch 2
    # (22 ms, where the curve says 13) make 3 tokens per 20 ms + 1 ms pay
    c.record_yield(2, tokens=3, draft_seconds=1e-3, step_seconds=20e-3)
    assert c.drafting_pays(2) is False  # against the curve's 13 ms: 2 / 13 > 3 / 21
    c.record_target(2, 22e-3, batch=2)
    assert c.drafting_pays(2) is True


def test_break_even_drafting_does_not_pay():
    """Drafting has to beat plain steps by DRAFTING_MARGIN: at break-even it only moves time from the
    sequences without accepted drafts to those with them (early finishers lose)."""
    c = CostModel()
    c.record_target(4, 20e-3, batch=4)  # plain steps: 4 tokens per 20 ms
    c.record_yield(4, tokens=5, draft_seconds=1e-3, step_seconds=23e-3)  # 5 per 24 ms: 1.04x
    assert c.drafting_pays(4) is False
    assert c.drafting_pays(4, margin=1.0) is True
    c2 = CostModel()
    c2.record_target(4, 20e-3, batch=4)
    c2.record_yield(4, tokens=5, draft_seconds=1e-3, step_seconds=22e-3)  # 5 per 23 ms: 1.09x
    assert c2.drafting_pays(4) is True


def test_auto_shape_measures_each_shape_then_takes_the_faster_and_rechecks_the_other():
    """Acceptance stays flat while the better shape flips: "auto" goes by what drafting steps of each
    shape yielded per second at this batch size, re-measuring the other shape every explore_every steps."""
    from specserve.drafters.base import Drafter
    from specserve.speculative import SpeculativeDecoder

    class Trees(Drafter):
        makes_trees = True

    dec = SpeculativeDecoder(Trees(), FixedPolicy, shape="auto", explore_every=4)
    c = dec.costs
    c.record_target(1, 10e-3, batch=1)  # plain: 1 token per 10 ms
    assert dec._pick_shape(1) == "chain"  # nothing measured: chains first, then trees
    c.record_yield(1, tokens=2, draft_seconds=1e-3, step_seconds=13e-3, shape="chain")  # 2 per 14 ms
    assert c.best_shape(1, ("chain", "tree")) == ("tree", False) and dec._pick_shape(1) == "tree"
    c.record_yield(1, tokens=3, draft_seconds=3e-3, step_seconds=27e-3, shape="tree")  # 3 per 30 ms
    assert c.drafting_rate(1, "tree") == pytest.approx(100) and c.drafting_rate(1, "chain") == pytest.approx(2 / 14e-3)
    picks = [dec._pick_shape(1) for _ in range(8)]
    assert picks.count("tree") == 2 and picks.count("chain") == 6  # the loser re-measured every 4th step
    assert c.drafting_pays(1) is True and c.drafting_pays(1, shape="tree") is False  # 100/s < 1.05 * 100/s
    # at batch 8 trees win: rows nearly free there (a GPU), the bigger tree's tokens count
    c.record_yield(8, tokens=2, draft_seconds=2e-3, step_seconds=30e-3, shape="chain")
    c.record_yield(8, tokens=3, draft_seconds=4e-3, step_seconds=32e-3, shape="tree")
    assert c.best_shape(8, ("chain", "tree")) == ("tree", True)
    # a drafter without trees never gets them, whatever is asked
    assert SpeculativeDecoder(Drafter(), FixedPolicy, shape="tree").shape == "chain"


def test_prompt_lookup_copies_what_followed_the_last_ngram():
    r = Request("0", [1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 1, 2, 3], SamplingParams())
    d = PromptLookupDrafter(max_ngram=3).propose([r], 3).drafts[0]
    assert d.tokens == [7, 8, 1] and d.probs is None  # the most recent earlier match of [1, 2, 3]
    r2 = Request("1", [5, 6, 7], SamplingParams())
    drafter = PromptLookupDrafter()
    assert drafter.propose([r2], 4).drafts[0].tokens == []
    assert "1" in drafter.index
    drafter.release(r2)
    assert "1" not in drafter.index  # a finished request's n-gram index goes with it


def test_the_ngram_index_answers_as_the_backward_scan_as_a_sequence_grows():
    """NgramIndex (incremental, what the drafter uses) against lookup_scan (the reference) on random
    sequences over small and large vocabularies, growing by 1-3 tokens between lookups."""
    import random

    from specserve.drafters.prompt_lookup import NgramIndex, lookup_scan
    rng = random.Random(0)
    found = 0
    for _ in range(200):
        vocab = rng.choice([2, 3, 5, 20, 200])
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 30))]
        index = NgramIndex(1, 4)
        for _ in range(40):
            k = rng.randrange(1, 8)
            got = index.lookup(ids, k)
            assert got == lookup_scan(ids, k, 1, 4), (ids, k)
            found += bool(got[0])
            ids = ids + [rng.randrange(vocab) for _ in range(rng.randrange(1, 4))]
    assert found > 1000  # most lookups found a match (the check is not vacuous)


def test_seeded_and_unseeded_requests_draft_in_one_pass():
    """Seeded sampled requests draft with the batch: one drafter call per step for all of them (their
    output does not depend on their drafts, sampling/seeded.py)."""
    from specserve.drafters.base import Draft, Drafter, Proposal
    from specserve.speculative import SpeculativeDecoder
    from specserve.types import Request, RequestStatus, SamplingParams

    class Recorder(Drafter):
        def __init__(self):
            self.calls = []

        def propose(self, requests, max_len, min_confidence=None, tree=None):
            self.calls.append(([r.request_id for r in requests], max_len))
            return Proposal([Draft([1] * max_len, None, [1.0] * max_len) for _ in requests])

    def decoding(rid, seed, temperature):
        r = Request(rid, [5, 6, 7], SamplingParams(temperature=temperature, max_tokens=8), seed=seed)
        r.output_token_ids = [8]
        r.status, r.num_computed_tokens = RequestStatus.RUNNING, 3  # the prompt computed, one token left: decoding
        return r

    drafter = Recorder()
    spec = SpeculativeDecoder(drafter, lambda: make_policy("fixed", 3), fallback=False)
    reqs = [decoding("a", 1, 0.8), decoding("b", 2, 0.8), decoding("c", 3, 0.8), decoding("g", None, 0.0)]
    drafts = spec.propose(reqs)
    assert drafter.calls == [(["a", "b", "c", "g"], 3)]
    assert all(drafts[r.request_id].tokens == [1, 1, 1] for r in reqs)


def test_seeded_requests_get_no_drafts_where_no_row_can_pay():
    """Where a further row costs more than a plain token (batch 8 on this curve), a batch of seeded
    requests decodes plainly, as an unseeded one does: priced apart at their own batch of 1 with a
    guessed draft cost, 16 seeded requests on the real pair verified long drafts every step and ran
    at half regular decoding's speed (docs/decisions.md#seeded-batch)."""
    from specserve.drafters.base import Draft, Drafter, Proposal
    from specserve.speculative import SpeculativeDecoder
    from specserve.types import Request, RequestStatus, SamplingParams

    class Counting(Drafter):
        calls = 0

        def propose(self, requests, max_len, min_confidence=None, tree=None):
            Counting.calls += 1
            return Proposal([Draft([1] * max_len, None, [0.99] * max_len) for _ in requests])

    spec = SpeculativeDecoder(Counting(), lambda: make_policy("fixed", 2))
    for rows, ms in {1: 10, 2: 11, 4: 13, 8: 30, 16: 64, 32: 132}.items():
        spec.costs.record_calibration(rows, ms / 1e3)
    batch = []
    for i in range(8):
        r = Request(str(i), [5, 6, 7], SamplingParams(temperature=0.8, max_tokens=64), seed=i)
        r.output_token_ids = [8]
        r.status, r.num_computed_tokens = RequestStatus.RUNNING, 3
        batch.append(r)
    for _ in range(10):
        assert spec.propose(batch) == {}
    assert Counting.calls == 0
    assert batch[0].request_id in spec.propose(batch[:1]) and Counting.calls == 1  # alone, rows are cheap


def test_lookups_are_not_timed_as_draft_model_steps():
    """A step whose drafts all came from lookups ran no draft model: its few microseconds must not
    enter the per-step draft time (they had pulled c to ~0.007 and made drafting look free)."""
    import time

    from specserve.drafters.base import Draft, Drafter, Proposal
    from specserve.speculative import SpeculativeDecoder
    from specserve.types import Request, RequestStatus, SamplingParams

    class Mixed(Drafter):
        model_runs = False

        def propose(self, requests, max_len, min_confidence=None, tree=None):
            if self.model_runs:
                time.sleep(0.01)  # a draft model: 2 passes over the batch
                return Proposal([Draft([1, 2], None, [0.9, 0.9]) for _ in requests], model_passes=2,
                                model_batch=len(requests))
            return Proposal([Draft([1, 2, 3], None, [0.9, 0.9, 0.9]) for _ in requests])  # a lookup: found at once

    def decoding(rid):
        r = Request(rid, [5, 6, 7], SamplingParams(temperature=0, max_tokens=8))
        r.output_token_ids = [8]
        r.status, r.num_computed_tokens = RequestStatus.RUNNING, 3
        return r

    drafter = Mixed()
    spec = SpeculativeDecoder(drafter, lambda: make_policy("fixed", 3), fallback=False)
    spec.propose([decoding("a")])
    assert spec.costs.draft_step_seconds(1) is None  # lookups only: nothing recorded
    drafter.model_runs = True
    spec.propose([decoding("b")])
    assert spec.costs.draft_step_seconds(1) >= 0.005  # 10 ms over 2 passes, not over 3 lookup tokens


def test_the_live_choice_follows_the_batch_size():
    """On a machine where rows are nearly free at batch 1 and cost their share at batch 16, the cost
    model drafts at batch 1, stops at 16, and drafts again when the batch shrinks back to 1, both as
    predicted before any drafting step and from what drafting steps measured (the decoder's choice)."""
    c = CostModel()
    for rows, ms in {1: 10, 2: 11, 4: 13, 8: 17, 16: 25, 32: 45, 64: 85}.items():
        c.record_calibration(rows, ms / 1e3)
    c.record_draft(1, 1e-3)
    c.record_draft(16, 3e-3)
    c.record_acceptance(accepted=60, rejections=40)
    assert c.best_len(1, 4) > 0 and c.best_len(16, 4) == 0 and c.best_len(1, 4) > 0
    c.record_yield(1, tokens=2, draft_seconds=3e-3, step_seconds=11e-3)  # 2 tokens in 14 ms vs 1 in 10
    c.record_yield(16, tokens=24, draft_seconds=6e-3, step_seconds=45e-3)  # 24 in 51 ms vs 16 in 25
    assert c.drafting_pays(1) is True and c.drafting_pays(16) is False and c.drafting_pays(1) is True


def test_selection_cuts_a_tree_by_cumulative_confidence_and_keeps_parents():
    from specserve.speculative import select_drafts
    from specserve.types import Draft
    # root -> 0 (0.8) -> 2 (0.9: 0.72) -> 4 (0.5: 0.36); root -> 1 (0.15); 0 -> 3 (0.05: 0.04)
    t = Draft([10, 11, 12, 13, 14], None, [0.8, 0.15, 0.9, 0.05, 0.5], [-1, -1, 0, 0, 2])
    assert t.depths() == [1, 1, 2, 2, 3]
    assert [round(c, 4) for c in t.cumulative()] == [0.8, 0.15, 0.72, 0.04, 0.36]
    # rows cost 0.3 of a plain token: nodes likelier than 0.3 (0, 2, 4) pay; as a chain, since they form one
    cut = select_drafts([t], [10 + 3 * n for n in range(6)])[0]
    assert cut.tokens == [10, 12, 14] and not cut.is_tree and cut.confidence == [0.8, 0.9, 0.5]
    # rows nearly free: the whole tree
    assert select_drafts([t], [10 + 0.01 * n for n in range(6)])[0] is t
    # rows at 0.1 of a token: node 1 (0.15) joins, a branch: a tree with reindexed parents
    cut = select_drafts([t], [10 + n for n in range(6)])[0]
    assert cut.tokens == [10, 11, 12, 14] and cut.parents == [-1, -1, 0, 2]
    with pytest.raises(ValueError, match="parent is not kept"):
        t.subset([0, 4])


def test_lookup_confidence_follows_what_copies_get_accepted():
    """The constants measured on code are a prior: copies that keep failing (chat, translations) lose
    confidence, for the request itself most and for everyone a little; a request's own successes lift it."""
    d = PromptLookupDrafter(max_ngram=3)
    r = Request("a", [1, 2, 3, 9, 1, 2, 3], SamplingParams())
    assert d.propose([r], 4).drafts[0].confidence[0] == pytest.approx(0.73)
    for _ in range(20):  # each copy verified (cut to its first token) and rejected there
        draft = d.propose([r], 4).drafts[0]
        d.on_verified(r, draft.subset([0]), 0)
        d.observe(r, 0, None, 0)
    own = d.propose([r], 4).drafts[0].confidence[0]
    other = d.propose([Request("b", [1, 2, 3, 9, 1, 2, 3], SamplingParams())], 4).drafts[0].confidence[0]
    assert own < 0.2 < other < 0.73 - 0.2
    d.propose([r], 4)  # a copy that the selection cut (no verify step): nothing is counted
    d.observe(r, 0, None, 0)
    assert d.propose([r], 4).drafts[0].confidence[0] == pytest.approx(own)
    d.release(r)
    assert d.propose([r], 4).drafts[0].confidence[0] == pytest.approx(other)


def test_while_drafting_pays_one_plain_step_in_plain_every_re_measures_plain_steps():
    """The machine's speed drifts, so a plain-step time measured before a long run of drafting steps
    goes stale: while drafting pays, every plain_every-th step is a bare plain step (no drafts, not even
    free ones, whose rows would spoil its timing); when drafting does not pay, plain steps come anyway."""
    from specserve.drafters.base import Draft, Drafter, Proposal
    from specserve.speculative import SpeculativeDecoder
    from specserve.types import Request, RequestStatus, SamplingParams

    class Always(Drafter):
        def propose(self, requests, max_len, min_confidence=None, tree=None):
            return Proposal([Draft([1, 2], None, [0.99, 0.99]) for _ in requests])

        def propose_free(self, requests, max_len):
            return self.propose(requests, max_len)

    r = Request("a", [5, 6, 7], SamplingParams(temperature=0, max_tokens=64))
    r.output_token_ids = [8]
    r.status, r.num_computed_tokens = RequestStatus.RUNNING, 3
    spec = SpeculativeDecoder(Always(), lambda: make_policy("fixed", 2), plain_every=3)
    for rows, ms in {1: 10, 2: 11, 4: 13, 8: 17}.items():  # a further row costs a tenth of a step
        spec.costs.record_calibration(rows, ms / 1e3)
    spec.costs.record_target(1, 10e-3, batch=1)  # plain: 1 token per 10 ms
    spec.costs.record_yield(1, tokens=3, draft_seconds=0.0, step_seconds=12e-3)  # drafting: 3 per 12 ms, pays
    pattern = []
    for _ in range(8):
        spec._step = None
        pattern.append("D" if r.request_id in spec.propose([r]) else ".")
    assert "".join(pattern) == "DDD.DDD."
    assert spec.stats.fallback_steps == 2


def test_a_drafting_step_drafts_only_for_the_sequences_expected_to_pay():
    """The per-sequence choice: in a batch where drafting pays, sequences whose recent acceptance is
    below the break-even confidence decode plainly (no draft pass, no catch-up, no verify rows), and
    are probed again after 4 plain steps, then 8; the others draft every step."""
    from specserve.drafters.base import Draft, Drafter, Proposal
    from specserve.speculative import SpeculativeDecoder

    class Always(Drafter):
        def propose(self, requests, max_len, min_confidence=None, tree=None):
            return Proposal([Draft([1] * max_len, None, [0.99] * max_len) for _ in requests])

    spec = SpeculativeDecoder(Always(), lambda: make_policy("fixed", 2), plain_every=1000)
    for rows, ms in {1: 10, 2: 11, 4: 13, 8: 17, 16: 25}.items():
        spec.costs.record_calibration(rows, ms / 1e3)
    spec.costs.record_target(4, 13e-3, batch=4)  # plain: 4 tokens per 13 ms
    spec.costs.record_draft(4, 1e-3)
    spec.costs.record_yield(4, tokens=8, draft_seconds=2e-3, step_seconds=15e-3)  # drafting: 8 per 17 ms, pays
    assert spec.costs.break_even_confidence(4) == pytest.approx((4 * 1 + 1) / 13)
    reqs = [_decoding(rid) for rid in ("good1", "bad1", "good2", "bad2")]
    for rid in ("good1", "good2"):
        spec.choice.recent[rid] = (8.0, 10.0)  # (8 + 2 * 0.5) / 12 = 0.75 with the prior: above 0.385
    for rid in ("bad1", "bad2"):
        spec.choice.recent[rid] = (0.0, 10.0)  # 1 / 12: below
    patterns = {r.request_id: "" for r in reqs}
    for _ in range(13):
        spec._step = None
        drafts = spec.propose(reqs)
        for r in reqs:
            patterns[r.request_id] += "D" if r.request_id in drafts else "."
    assert patterns["good1"] == patterns["good2"] == "D" * 13
    assert patterns["bad1"] == patterns["bad2"] == "...D.......D."
    # the batch's own probe (after its plain steps) drafts for one sequence at least, the likeliest
    spec.choice.recent["bad2"] = (1.0, 10.0)
    assert spec.choice.worth_drafting([reqs[1], reqs[3]], 0.385) == []
    assert spec.choice.worth_drafting([reqs[1], reqs[3]], 0.385, probe=True) == [reqs[3]]
    spec.release(reqs[1])
    assert "bad1" not in spec.choice.recent and "bad1" not in spec.choice.plain
    # verification moves a sequence's recent acceptance: 1 of its 2 drafts accepted, then a rejection
    good = reqs[0]
    logits = torch.zeros(3, 4)
    logits[0, 1] = logits[1, 2] = logits[2, 3] = 1.0  # the target takes draft 1, then wants 2 (not 1)
    verify_and_learn(spec, [good], [Draft([1, 1], None, [0.99, 0.99])], [logits])
    assert spec.choice.recent["good1"] == pytest.approx((0.8 * 8 + 1, 0.8 * 10 + 2))


def test_a_plain_sequence_is_probed_less_often_where_its_share_of_a_step_is_small():
    """A probe that finds nothing costs a draft pass and a verify row; the wait between a sequence's
    probes grows until that is 2% of its plain decoding: retry_max (16) at batch 1, where a sequence
    has the whole step, 72 steps at batch 16 on this curve."""
    from specserve.drafters.base import Drafter
    from specserve.speculative import SpeculativeDecoder

    spec = SpeculativeDecoder(Drafter(), lambda: make_policy("fixed", 2))
    assert spec.choice.probe_wait(16) == spec.retry_max == 16  # nothing measured yet
    for rows, ms in {1: 10, 2: 11, 4: 13, 8: 17, 16: 25, 32: 45}.items():
        spec.costs.record_calibration(rows, ms / 1e3)
    spec.costs.record_draft(1, 1e-3)
    assert spec.choice.probe_wait(1) == 16  # (1 + 1) ms / (0.02 * 10 ms) = 10 steps: retry_max
    assert spec.choice.probe_wait(16) in (72, 73)  # (1 + 1.25) ms / (0.02 * 25 / 16 ms), rounded up


def test_no_drafts_lookups_or_probes_where_not_even_a_certain_token_pays_for_its_row():
    """At a batch size whose next rows cost more than the plain tokens their time would give (the
    2-core CPU at batch 16), the step is a bare plain step: the drafter is not asked for drafts or
    free drafts, since the selection would cut them all. Where rows are cheap it drafts."""
    from specserve.drafters.base import Draft, Drafter, Proposal
    from specserve.speculative import SpeculativeDecoder

    class Counting(Drafter):
        calls = 0

        def propose(self, requests, max_len, min_confidence=None, tree=None):
            Counting.calls += 1
            return Proposal([Draft([1] * max_len, None, [0.99] * max_len) for _ in requests])

        def propose_free(self, requests, max_len):
            Counting.calls += 1
            return None

    spec = SpeculativeDecoder(Counting(), lambda: make_policy("fixed", 2))
    # rows 1-4 cheap (memory-bound), then each row costs more than a plain token at batch 4 and up
    for rows, ms in {1: 10, 2: 11, 4: 13, 8: 30, 16: 64, 32: 132}.items():
        spec.costs.record_calibration(rows, ms / 1e3)
    assert spec.costs.rows_can_pay(1, 3) and spec.costs.rows_can_pay(2, 2)
    assert not spec.costs.rows_can_pay(8, 16) and not spec.costs.rows_can_pay(16, 32)
    batch = [_decoding(str(i)) for i in range(8)]
    for _ in range(20):
        assert spec.propose(batch) == {}
    assert Counting.calls == 0
    assert spec.stats.fallback_steps == 20
    drafts = spec.propose(batch[:1])
    assert Counting.calls == 1 and batch[0].request_id in drafts


def test_plain_sequences_are_not_probed_where_the_gate_is_above_what_drafts_reach():
    """Above PROBE_MAX_GATE (a draft token must be accepted 90% of the time to pay) a sequence below
    the gate is not probed, and the batch's probe drafts for nobody: a probe first catches the draft
    up on all the sequence's tokens, and the shipped draft's first tokens are not that good."""
    from specserve.drafters.base import Drafter
    from specserve.speculative import SpeculativeDecoder
    from specserve.speculative.choice import PROBE_MAX_GATE
    from specserve.types import Request, SamplingParams

    spec = SpeculativeDecoder(Drafter(), lambda: make_policy("fixed", 2))
    reqs = [Request(str(i), [1, 2], SamplingParams(temperature=0)) for i in range(3)]
    spec.choice.recent["0"] = (99.0, 100.0)  # accepted 99% (98% with the prior): drafts even at a high gate
    for rid in ("1", "2"):
        spec.choice.recent[rid] = (0.0, 10.0)
    high, low = PROBE_MAX_GATE + 0.02, PROBE_MAX_GATE - 0.3
    picked = [spec.choice.worth_drafting(reqs, high, probe=True) for _ in range(40)]
    assert all(p == [reqs[0]] for p in picked)
    assert spec.choice.worth_drafting(reqs[1:], high, probe=True) == []
    # below the cap the same sequences are probed again after their waits
    probed = sum(reqs[1] in spec.choice.worth_drafting(reqs, low) for _ in range(40))
    assert probed >= 2


def test_the_selection_prices_rows_at_the_whole_steps_batch_when_few_sequences_draft():
    """At batch 8 the per-sequence choice drafts for one sequence only; its rows ride a step of 8, so
    they are priced on the batch-8 curve (a row ~ a plain token here: 0.8-confidence tokens are cut),
    not on batch 1's (a row a tenth of a token: they would all be verified)."""
    from specserve.drafters.base import Draft, Drafter, Proposal
    from specserve.speculative import SpeculativeDecoder, select_drafts

    class Likely(Drafter):
        asked: list = []

        def propose(self, requests, max_len, min_confidence=None, tree=None):
            Likely.asked.append([r.request_id for r in requests])
            return Proposal([Draft([1] * max_len, None, [0.8] * max_len) for _ in requests])

    curve_ms = {1: 10, 2: 11, 4: 13, 8: 17, 9: 19, 16: 27}
    spec = SpeculativeDecoder(Likely(), lambda: make_policy("fixed", 2), plain_every=1000)
    for rows, ms in curve_ms.items():
        spec.costs.record_calibration(rows, ms / 1e3)
    spec.costs.record_draft(8, 1e-3)
    spec.costs.record_yield(8, tokens=16, draft_seconds=2e-3, step_seconds=20e-3)  # drafting has paid at 8
    reqs = [_decoding(str(i)) for i in range(8)]
    spec.choice.recent["0"] = (99.0, 100.0)  # the one sequence above the gate
    for r in reqs[1:]:
        spec.choice.recent[r.request_id] = (0.0, 100.0)
    drafts = spec.propose(reqs)
    assert Likely.asked == [["0"]]  # the per-sequence choice drafted for the one sequence
    assert drafts == {}  # and the batch-8 curve cut its rows
    # the same draft alone (batch 1): rows are cheap, both tokens verified
    d = Draft([1, 1], None, [0.8, 0.8])
    curve1 = [curve_ms[1] / 1e3, curve_ms[2] / 1e3, (curve_ms[2] + curve_ms[4]) / 2e3]
    assert select_drafts([d], curve1)[0] is d


def test_drafts_are_priced_on_top_of_the_prompt_chunk_the_step_carries():
    """propose(running, prompt_rows): the same batch-1 draft is verified in a step of its own, and cut
    where the step also carries 15 prompt tokens and its rows would cross a cliff of the curve (as
    the block kernel's 32-row limit)."""
    from specserve.drafters.base import Draft, Drafter, Proposal
    from specserve.speculative import SpeculativeDecoder

    class Likely(Drafter):
        def propose(self, requests, max_len, min_confidence=None, tree=None):
            return Proposal([Draft([1] * max_len, None, [0.8] * max_len) for _ in requests])

    spec = SpeculativeDecoder(Likely(), lambda: make_policy("fixed", 2), plain_every=1000)
    for rows, ms in {1: 10, 2: 11, 4: 13, 8: 17, 16: 25, 17: 40, 32: 60}.items():
        spec.costs.record_calibration(rows, ms / 1e3)
    spec.costs.record_draft(1, 1e-3)
    spec.costs.record_yield(1, tokens=2, draft_seconds=2e-3, step_seconds=12e-3)  # drafting pays at 1
    drafts = []
    for prompt_rows in (0, 15):
        r = _decoding(str(prompt_rows))
        drafts.append(spec.propose([r], prompt_rows).get(r.request_id))
    assert drafts[0] is not None and drafts[0].tokens == [1, 1]
    assert drafts[1] is None


def test_a_stalled_draft_timing_comes_down_at_the_next_probe():
    """One stalled draft step had set the draft's step time to ~10x its real cost, and since the
    probes that follow plain steps first catch the draft up (never timed as steady steps), drafting
    stayed off for the rest of the run. A probe's time per pass, catch-up included, bounds a steady
    step from above: the estimate comes down to it, and never goes up from it."""
    import time

    from specserve.drafters.base import Draft, Drafter, Proposal
    from specserve.speculative import SpeculativeDecoder
    from specserve.types import Request, RequestStatus, SamplingParams

    class CatchingUp(Drafter):
        delay = 0.0

        def propose(self, requests, max_len, min_confidence=None, tree=None):  # a catch-up on 40 rows first
            time.sleep(self.delay)
            return Proposal([Draft([1, 2], None, [0.9, 0.9]) for _ in requests], model_passes=2,
                            model_batch=len(requests), catchup_rows=40 * len(requests))

    def decoding(rid):
        r = Request(rid, [5, 6, 7], SamplingParams(temperature=0, max_tokens=8))
        r.output_token_ids = [8]
        r.status, r.num_computed_tokens = RequestStatus.RUNNING, 3
        return r

    drafter = CatchingUp()
    spec = SpeculativeDecoder(drafter, lambda: make_policy("fixed", 2), fallback=False)
    spec.costs.record_draft(1, 5.0)  # the stalled step: 5 s
    spec.propose([decoding("a")])
    assert spec.costs.draft_step_seconds(1) < 0.5  # the probe's passes took microseconds
    spec.costs.record_draft(1, 1e-3)  # a steady step: 1 ms
    drafter.delay = 0.02  # a probe whose catch-up takes 10 ms a pass: no news about a steady step
    spec.propose([decoding("b")])
    assert spec.costs.draft_step_seconds(1) < 2e-3


def test_free_drafts_on_plain_steps_stop_where_they_yield_less_than_bare_plain_steps():
    """A plain step verifies free drafts (lookups) and is measured as the "free" shape; where such steps
    emitted fewer tokens per second than bare plain steps at the batch size, plain steps leave them out
    but for one in explore_every, which measures again; where they pay they stay. Model drafting's
    own measurements (drafting_pays) do not count them."""
    from specserve.drafters.base import Draft, Drafter, Proposal
    from specserve.speculative import SpeculativeDecoder
    from specserve.speculative.cost_model import FREE_SHAPE

    class Free(Drafter):
        calls = 0

        def propose(self, requests, max_len, min_confidence=None, tree=None):
            return Proposal([Draft() for _ in requests])

        def propose_free(self, requests, max_len):
            Free.calls += 1
            return Proposal([Draft([1], None, [0.99]) for _ in requests])

    spec = SpeculativeDecoder(Free(), lambda: make_policy("fixed", 2), explore_every=4)
    for rows, ms in {1: 10, 2: 10.5, 4: 11, 8: 12, 16: 14, 32: 20}.items():  # rows nearly free: lookups pass selection
        spec.costs.record_calibration(rows, ms / 1e3)
    batch = [_decoding(str(i)) for i in range(4)]
    spec.costs.record_target(4, 11e-3, batch=4)  # bare plain steps: 4 tokens per 11 ms
    spec.costs.record_yield(4, tokens=4, draft_seconds=0.0, step_seconds=13e-3, shape="chain")  # model drafting loses
    assert spec.costs.drafting_pays(4) is False

    def plain_step():
        out = {}
        spec._step = None
        spec._plain_step(out, batch, 2)
        return out

    assert plain_step() and spec._step.shape == FREE_SHAPE  # not measured yet: verified, and measured
    # they paid: 5 tokens per 11 ms: they stay, and model drafting still does not pay
    spec.costs.record_yield(4, tokens=int(1.3 * 4), draft_seconds=0.0, step_seconds=11e-3, shape=FREE_SHAPE)
    assert spec.costs.free_drafts_pay(4) and all(plain_step() for _ in range(6))
    assert spec.costs.drafting_pays(4) is False
    # they lost: 4 tokens per 13 ms, worse than bare plain steps: left out but for one step in 4
    spec.costs.yields[4, FREE_SHAPE] = [1.0, 0.0, 13e-3]
    assert spec.costs.free_drafts_pay(4) is False
    calls = Free.calls
    pattern = "".join("F" if plain_step() else "." for _ in range(8))
    assert pattern == "...F...F" and Free.calls == calls + 2
