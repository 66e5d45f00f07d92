"""A draft model computes each prompt chunk in the step the target computes it (Drafter.prefill), so its
first drafting step feeds only the tokens decoded since, and the drafts are the ones a whole catch-up
at the first drafting step gave."""
import pytest

from specserve import LLM, SamplingParams
from specserve.drafters.draft_model import DraftModelDrafter

from .tiny import make_tiny

pytest.importorskip("transformers")

PROMPT = [5, 6, 7, 8, 5, 6, 9, 40, 3, 9, 1, 2, 3]  # 13 tokens: four chunks of 4 (the last one of 1)
GREEDY = SamplingParams(temperature=0, max_tokens=16)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("prefill")
    target, draft = str(d / "target"), str(d / "draft")
    make_tiny("llama", target, seed=0)
    make_tiny("llama", draft, seed=0)  # the target's weights in a file of its own: drafts get accepted
    return target, draft


def _engine(target, draft, method):
    spec = dict(method=method, draft_model=draft, policy="fixed", draft_len=3, fallback=False)
    if method == "staged":
        spec["stages"] = ["draft", "lookup"]
    llm = LLM(target, kv_cache_gib=0.01, block_size=4, prefill_chunk=4, speculative=spec)
    d = llm.engine.speculator.drafter
    return llm, (d.model if method == "staged" else d)


@pytest.mark.parametrize("method", ["draft", "staged"])
def test_the_draft_computes_each_prompt_chunk_with_the_target(pair, method):
    llm, model = _engine(*pair, method)
    eng = llm.engine
    (req,) = eng.add_request(PROMPT, GREEDY)
    seen = []
    while not req.output_token_ids:
        eng.step()
        seen.append(model.kv.num_done.get(req.request_id, 0))
    assert seen == [4, 8, 12, 13]  # the target's chunks, step by step
    catchups = []
    propose = model.propose if method == "draft" else None
    if propose is not None:
        def spy(*a, **kw):
            p = propose(*a, **kw)
            catchups.append(p.catchup_rows)
            return p
        model.propose = spy
    eng.step()  # the first drafting step
    assert llm.spec_stats()["drafted"] > 0
    if method == "draft":
        assert catchups == [1]  # the first sampled token only


@pytest.mark.parametrize("method", ["draft", "staged"])
def test_drafts_are_those_of_a_whole_catch_up(pair, method, monkeypatch):
    def run():
        llm, _ = _engine(*pair, method)
        out = llm.generate([PROMPT, PROMPT[3:]], GREEDY)
        st = llm.spec_stats()
        return [(o.outputs[0].token_ids, o.outputs[0].origins) for o in out], (st["drafted"], st["accepted"])

    chunked, accepted = run()
    monkeypatch.setattr(DraftModelDrafter, "prefill", lambda self, chunks: None)  # caught up when it first drafts
    whole, accepted_whole = run()
    assert chunked == whole and accepted == accepted_whole and accepted[1] > 0


def test_no_draft_prefill_for_a_request_that_does_not_speculate(pair):
    llm, model = _engine(*pair, "draft")
    plain = SamplingParams(temperature=0, max_tokens=4, speculative=False)
    (req,) = llm.engine.add_request(PROMPT, plain)
    while not req.output_token_ids:  # the prompt's steps (a finished request's draft state is released)
        llm.engine.step()
    assert model.kv.num_done.get(req.request_id, 0) == 0


# the cost model's answers that let a new sequence draft, and one that each check blocks it with
LETS_DRAFT = {"rows_can_pay": True, "drafting_pays": None, "break_even_confidence": 0.0}
BLOCKS = {"rows_can_pay": False, "drafting_pays": False, "break_even_confidence": 1.0}


@pytest.mark.parametrize("check", [None, *BLOCKS])
def test_no_draft_prefill_where_a_new_sequence_would_not_draft(pair, check, monkeypatch):
    """With the cost model choosing, decided at the prompt's first chunk: no prefill where no draft row
    can pay at the batch size, where drafting steps there were measured to lose, or where the batch's
    acceptance is below the per-sequence gate (a sequence that drafts later catches up then). The
    cost model's answers are set: measured on the tiny model they follow the machine's timing."""
    spec = dict(method="draft", draft_model=pair[1])
    llm = LLM(pair[0], kv_cache_gib=0.01, block_size=4, prefill_chunk=4, speculative=spec)
    dec = llm.engine.speculator
    for name, value in LETS_DRAFT.items():
        monkeypatch.setattr(dec.costs, name, lambda *a, v=(BLOCKS[name] if name == check else value), **kw: v)
    (req,) = llm.engine.add_request(PROMPT, GREEDY)
    done = []
    while not req.output_token_ids:
        llm.engine.step()
        done.append(dec.drafter.kv.num_done.get(req.request_id, 0))
    assert done == ([4, 8, 12, 13] if check is None else [0, 0, 0, 0])


def test_no_draft_prefill_beside_other_sequences(pair):
    llm, model = _engine(*pair, "draft")
    llm.engine.add_request(PROMPT, GREEDY)
    (b,) = llm.engine.add_request(PROMPT[2:], GREEDY)
    done = []
    while not b.output_token_ids:  # b's prompt steps: only a prefill could compute b's draft KV
        llm.engine.step()
        done.append(model.kv.num_done.get(b.request_id, 0))
    assert len(done) > 1 and not any(done)
