"""The automatic drafter hands each sequence the draft expected to give the most tokens: a free
draft where its summed cumulative confidence beats what the draft model's measured acceptance
promises, the model's elsewhere (run only for those sequences); verified model drafts move the
model's acceptance estimate."""
from specserve.drafters.auto import AutoDrafter, expected_tokens
from specserve.drafters.base import Drafter, Proposal
from specserve.types import Draft, Request, SamplingParams, TokenOrigin


class Free(Drafter):
    origin = TokenOrigin.LOOKUP

    def __init__(self, table):
        self.table = table  # rid -> (tokens, confidences)
        self.verified = []  # on_verified calls: (rid, draft tokens, accepted)

    def on_verified(self, request, draft, accepted):
        self.verified.append((request.request_id, draft.tokens, accepted))

    def propose(self, requests, max_len, min_confidence=None, tree=None):
        drafts = []
        for r in requests:
            tokens, conf = self.table.get(r.request_id, ([], []))
            drafts.append(Draft(tokens, None, conf, origin=TokenOrigin.LOOKUP))
        return Proposal(drafts)


class Model(Drafter):
    def __init__(self):
        self.asked = []

    def propose(self, requests, max_len, min_confidence=None, tree=None):
        self.asked.append([r.request_id for r in requests])
        return Proposal([Draft([7] * max_len, None, [0.6] * max_len) for _ in requests], max_len, len(requests))


def _req(rid):
    return Request(rid, [1, 2, 3], SamplingParams(temperature=0))


def test_each_sequence_gets_the_draft_expected_to_give_most():
    free = Free({"strong": ([5, 6, 7], [0.95, 0.9, 0.9]), "weak": ([5], [0.3])})
    model = Model()
    auto = AutoDrafter([free], model)
    reqs = [_req("strong"), _req("weak"), _req("none")]
    p = auto.propose(reqs, 3)
    # the model (prior alpha 0.6) promises 0.6 + 0.36 + 0.216 = 1.18 tokens: more than "weak" (0.3), less
    # than "strong" (0.95 + 0.855 + 0.77)
    assert model.asked == [["weak", "none"]]
    assert p.drafts[0].origin == TokenOrigin.LOOKUP and p.drafts[0].tokens == [5, 6, 7]
    assert p.drafts[1].tokens == [7, 7, 7] and p.drafts[2].tokens == [7, 7, 7]
    assert p.model_passes == 3 and p.model_batch == 2
    assert expected_tokens(p.drafts[0]) > expected_tokens(p.drafts[1])


def test_verified_model_drafts_move_the_estimate_and_the_choice():
    free = Free({"r": ([5, 6], [0.7, 0.7])})  # promises 0.7 + 0.49 = 1.19
    model = Model()
    auto = AutoDrafter([free], model)
    r = _req("r")
    model_draft = Draft([7, 7, 7], None, [0.6] * 3)
    for _ in range(40):  # the model's drafts keep being accepted whole
        auto.on_verified(r, model_draft, 3)
        auto.observe(r, 0, None, 3)
    assert auto.model_alpha > 0.9
    auto.propose([r], 2)
    assert model.asked == [["r"]]  # now the model promises more than the copy
    for _ in range(200):  # and then always rejected at once
        auto.on_verified(r, model_draft, 0)
        auto.observe(r, 0, None, 0)
    assert auto.model_alpha < 0.3
    assert auto.propose([r], 2).drafts[0].tokens == [5, 6] and len(model.asked) == 1
    # a verified copy goes to the free drafter that made it, and leaves the model's estimate alone
    alpha = auto.model_alpha
    auto.on_verified(r, Draft([5, 6], None, [0.7, 0.7], origin=TokenOrigin.LOOKUP), 1)
    assert free.verified == [("r", [5, 6], 1)] and auto.model_alpha == alpha
