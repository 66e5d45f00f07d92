"""n-best on the embedded model: best_of answers with the best samples of the same seeded draws, the
log-probabilities that rank them are the model's (with and without speculation), and a time budget
stops the samples still running and answers with those finished."""
import time

import pytest

from specserve import LLM, SamplingParams

PROMPT = "Write one sentence about the sea."


def chat_ids(llm, text=PROMPT):
    return llm.tokenizer.encode(llm.tokenizer.apply_chat_template([{"role": "user", "content": text}]),
                                add_special_tokens=False)


def test_best_of_answers_with_the_n_likeliest_of_the_same_seeded_samples(embedded_llm):
    ids = chat_ids(embedded_llm)
    every = embedded_llm.generate(ids, SamplingParams(n=6, temperature=1.0, seed=3, max_tokens=40, logprobs=True))[0]
    best = embedded_llm.generate(ids, SamplingParams(n=2, best_of=6, temperature=1.0, seed=3, max_tokens=40))[0]
    means = sorted(((sum(o.logprobs) / len(o.logprobs), o.index) for o in every.outputs), key=lambda m: (-m[0], m[1]))
    want = [every.outputs[i] for _, i in means[:2]]
    assert [o.token_ids for o in best.outputs] == [o.token_ids for o in want]
    assert [o.index for o in best.outputs] == [0, 1]  # the rank
    for got, ref in zip(best.outputs, want):  # computed for the ranking though not asked for (logprobs=False)
        assert got.logprobs is None and abs(got.cumulative_logprob - sum(ref.logprobs)) < 1e-4
    assert len({tuple(o.token_ids) for o in every.outputs}) > 2  # the samples differ: the choice matters


def test_ranked_logprobs_under_speculation_are_the_models(embedded_llm):
    spec = LLM(speculative="lookup")
    ids = embedded_llm.tokenizer.encode("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):")
    want = embedded_llm.generate(ids, SamplingParams(temperature=0, max_tokens=40, logprobs=True))[0].outputs[0]
    got = spec.generate(ids, SamplingParams(n=1, best_of=2, temperature=0, max_tokens=40))[0].outputs[0]
    assert got.token_ids == want.token_ids and sum(got.accepted_per_step) > 0  # drafts were verified
    assert abs(got.cumulative_logprob - sum(want.logprobs)) < 1e-3


@pytest.mark.parametrize("budget", [0.4, pytest.param(30.0, marks=pytest.mark.full)])  # 30 s: 40 s of best_of on a Zen 3
def test_a_time_budget_stops_the_running_samples_and_answers_with_the_finished(embedded_llm, budget):
    ids = chat_ids(embedded_llm, "Tell me a long story about a dragon.")
    # ignore_eos: no sample can finish before 400 tokens, which take seconds; a short budget stops them all
    params = SamplingParams(n=3, best_of=6, temperature=1.0, seed=7, max_tokens=400, best_of_deadline_s=budget,
                            ignore_eos=budget < 1)
    t0 = time.perf_counter()
    out = embedded_llm.generate(ids, params)[0].outputs
    wall = time.perf_counter() - t0
    reasons = [o.finish_reason for o in out]
    if budget < 1:  # stopped within a step of the budget, answered with the stopped ones, ranked
        assert wall < budget + 1.0 and reasons == ["deadline"] * 3 and all(0 < len(o.token_ids) < 400 for o in out)
    else:  # a budget that never runs out: the same answer as best_of alone
        plain = embedded_llm.generate(ids, SamplingParams(n=3, best_of=6, temperature=1.0, seed=7, max_tokens=400))[0]
        assert [o.token_ids for o in out] == [o.token_ids for o in plain.outputs] and "deadline" not in reasons
    assert 1 <= len(out) <= 3 and [o.index for o in out] == list(range(len(out)))
    means = [o.cumulative_logprob / len(o.token_ids) for o in out]
    assert means == sorted(means, reverse=True)
    assert not embedded_llm.engine.has_unfinished() and embedded_llm.engine.scheduler.blocks.num_free_blocks == \
        embedded_llm.engine.scheduler.blocks.num_blocks
