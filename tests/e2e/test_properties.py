"""Property-based: any valid SamplingParams with any prompt (text, unicode, token ids, lists of them)
generates without crash or hang and leaves the engine as it found it. derandomize=True: the same
examples every run, so CI stays deterministic and fast."""
import pytest

from specserve import SamplingParams

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

PROMPT, GREEDY = "def fibonacci(n):", SamplingParams(temperature=0, max_tokens=8)

params = st.builds(
    SamplingParams,
    n=st.integers(1, 3),
    temperature=st.one_of(st.just(0.0), st.floats(0.05, 2.0)),
    top_p=st.floats(0.05, 1.0),
    top_k=st.integers(-1, 50),
    max_tokens=st.integers(1, 6),
    seed=st.one_of(st.none(), st.integers(0, 2**32)),
    stop=st.lists(st.text(min_size=1, max_size=3), max_size=2),
    stop_token_ids=st.lists(st.integers(0, 49151), max_size=2),
    ignore_eos=st.booleans(),
    logprobs=st.one_of(st.booleans(), st.integers(0, 20)),
)
one_prompt = st.one_of(st.text(min_size=1, max_size=40), st.lists(st.integers(0, 49151), min_size=1, max_size=20))
prompts = st.one_of(one_prompt, st.lists(one_prompt, min_size=1, max_size=3))


@hypothesis.settings(max_examples=30, deadline=None, derandomize=True,
                     suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture, hypothesis.HealthCheck.too_slow])
@hypothesis.given(prompt=prompts, p=params)
def test_any_valid_request_generates_and_leaves_the_engine_clean(embedded_llm, prompt, p):
    reference = embedded_llm.generate(PROMPT, GREEDY)[0].outputs[0].token_ids
    outs = embedded_llm.generate(prompt, p)
    n_prompts = 1 if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)) else len(prompt)
    assert len(outs) == n_prompts
    for out in outs:
        assert len(out.outputs) == p.n
        for o in out.outputs:
            assert 1 <= len(o.token_ids) <= p.max_tokens and o.finish_reason in ("stop", "length")
            assert (o.logprobs is not None) == p.wants_logprobs and (o.top_logprobs is not None) == bool(p.num_top_logprobs)
            assert not p.wants_logprobs or len(o.logprobs) == len(o.token_ids)
            assert not p.num_top_logprobs or [len(t) for t in o.top_logprobs] == [p.num_top_logprobs] * len(o.token_ids)
    eng = embedded_llm.engine
    assert not eng.has_unfinished() and eng.scheduler.blocks.num_free_blocks == eng.scheduler.blocks.num_blocks
    assert embedded_llm.generate(PROMPT, GREEDY)[0].outputs[0].token_ids == reference
