"""The engine survives bad input, failures, interrupts and concurrent callers: each case gets its
one-line error (or the right answer), and afterwards the same LLM produces output token-identical to
what it produced before (the engine is deterministic for greedy and seeded requests)."""
import threading

import pytest

from specserve import LLM, SamplingParams
from specserve.types import FinishReason

GREEDY = SamplingParams(temperature=0, max_tokens=12)
PROMPT = "def fibonacci(n):"


def ids_of(outs):
    return [[o.token_ids for o in r.outputs] for r in outs]


@pytest.fixture(scope="module")
def reference(embedded_llm):
    return ids_of(embedded_llm.generate([PROMPT, "Hello"], GREEDY))


def assert_clean(llm: LLM, reference):
    """Nothing left queued, every KV block free, and the same output as before."""
    eng = llm.engine
    assert not eng.has_unfinished() and not eng._live and not eng._siblings
    assert eng.scheduler.blocks.num_free_blocks == eng.scheduler.blocks.num_blocks
    assert ids_of(llm.generate([PROMPT, "Hello"], GREEDY)) == reference


def test_a_bad_prompt_late_in_the_list_queues_nothing(embedded_llm, reference):
    vocab = embedded_llm.engine.arch.vocab_size
    for bad, match in (([1, vocab], r"token ids must be in \[0"), ([1, 2.5], "must be integers"), ([], "empty")):
        with pytest.raises(ValueError, match=match):
            embedded_llm.generate([PROMPT, "Hello", bad], GREEDY)
        assert_clean(embedded_llm, reference)
    with pytest.raises(ValueError, match="params must be SamplingParams"):
        embedded_llm.generate([PROMPT], [{"temperature": 0}])
    assert_clean(embedded_llm, reference)


@pytest.mark.parametrize("error", [RuntimeError("callback failed"), KeyboardInterrupt()])
def test_an_error_or_interrupt_mid_generation_frees_exactly_its_requests(embedded_llm, reference, error):
    seen = []

    def on_text(i, s, delta, finished):
        seen.append(delta)
        if len(seen) == 5:
            raise error

    with pytest.raises(type(error)):
        embedded_llm.generate([PROMPT, "Hello", "def add(a, b):"], SamplingParams(n=2, temperature=0.8, seed=3,
                                                                                  max_tokens=40), on_text=on_text)
    assert len(seen) == 5
    assert_clean(embedded_llm, reference)


def test_generate_from_inside_its_own_callback_is_refused(embedded_llm, reference):
    def on_text(*_):
        embedded_llm.generate("x", GREEDY)

    with pytest.raises(RuntimeError, match="inside its own on_text"):
        embedded_llm.generate(PROMPT, GREEDY, on_text=on_text)
    assert_clean(embedded_llm, reference)


def test_abort_frees_blocks_drafter_state_and_generators(reference):
    """A request aborted mid-decode (and a leader whose samples still wait for its prompt) leaves
    nothing behind in the scheduler, the drafter's own cache or the engine's per-request state."""
    llm = LLM(speculative={"method": "draft", "fallback": False}, kv_cache_gib=0.05)
    eng = llm.engine
    drafter = eng.speculator.drafter
    [a] = eng.add_request(llm.tokenizer.encode(PROMPT), SamplingParams(temperature=0, max_tokens=40))
    for _ in range(4):
        eng.step()
    assert a.output_token_ids and a.block_table and a.request_id in drafter.kv.tables
    group = eng.add_request(llm.tokenizer.encode("Hello"), SamplingParams(n=3, temperature=0.7, seed=1, max_tokens=8))
    eng.abort([a.request_id, group[0].request_id])  # the leader: its two waiting samples go too
    assert a.finish_reason == FinishReason.ABORT and a.is_finished and a.block_table == []
    assert all(r.finish_reason == FinishReason.ABORT for r in group)
    assert a.request_id not in drafter.kv.tables and a.request_id not in drafter.pending
    assert a.request_id not in drafter.picker.generators
    eng.abort(["no-such-id", a.request_id])  # unknown or already aborted: nothing happens
    assert_clean(llm, reference)


def test_eight_threads_sharing_one_llm_get_what_each_call_gets_alone(embedded_llm):
    prompts = ["def add(a, b):", "Hello", "The capital of France", "import os", "for i in range(", "x = [",
               "class Stack:", "# a comment"]
    params = [SamplingParams(temperature=0, max_tokens=6), SamplingParams(temperature=0.9, seed=7, max_tokens=6)]
    calls = [(prompts[(t + i) % len(prompts)], (t * 20 + i) % 2) for t in range(8) for i in range(20)]
    alone = {(p, k): ids_of(embedded_llm.generate(p, params[k])) for p, k in set(calls)}
    got, errors = {}, []

    def worker(t):
        try:
            for i in range(20):
                p, k = calls[t * 20 + i]
                got[(t, i)] = ((p, k), ids_of(embedded_llm.generate(p, params[k])))
        except Exception as e:  # surfaced below: a thread's exception would otherwise be lost
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=600)
    assert not errors and len(got) == 160
    assert all(out == alone[key] for key, out in got.values())
