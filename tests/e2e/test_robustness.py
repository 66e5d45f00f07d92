"""The engine survives bad input, failures, interrupts and concurrent callers: each case gets its
one-line error (or the right answer), and afterwards the same LLM produces output token-identical to
what it produced before (the engine is deterministic for greedy and seeded requests)."""
import dataclasses
import threading

import pytest

from specserve import LLM, SamplingParams
from specserve.types import FinishReason

GREEDY = SamplingParams(temperature=0, max_tokens=12)
PROMPT = "def fibonacci(n):"


def ids_of(outs):
    return [[o.token_ids for o in r.outputs] for r in outs]


@pytest.fixture(scope="module")
def reference():
    """What a fresh LLM produces (its own object, so nothing any case did can leak into it)."""
    return ids_of(LLM(kv_cache_gib=0.1).generate([PROMPT, "Hello"], GREEDY))


def assert_clean(llm: LLM, reference):
    """Nothing left queued, every KV block free, and the same output as before."""
    eng = llm.engine
    assert not eng.has_unfinished() and not eng._live and not eng._siblings
    assert eng.scheduler.blocks.num_free_blocks == eng.scheduler.blocks.num_blocks
    assert ids_of(llm.generate([PROMPT, "Hello"], GREEDY)) == reference


def tampered(**fields):
    """SamplingParams changed after construction (validation must run again at generate)."""
    p = SamplingParams(temperature=0, max_tokens=4)
    for k, v in fields.items():
        object.__setattr__(p, k, v)
    return p


# Each case from the issue that reaches LLM.generate: (prompt, params, the one-line error's text).
BAD_CALLS = {
    "200k-token prompt": ([1] * 200_000, GREEDY, "the prompt has 200000 tokens; the model's context is"),
    "out-of-range token id": ([1, 10**9], GREEDY, r"token ids must be in \[0"),
    "negative token id": ([1, -1], GREEDY, r"token ids must be in \[0"),
    "float token id": ([1, 2.0], GREEDY, r"token ids \(integers\), got a list holding float"),  # a TypeError
    "bool token id": ([True, 2], GREEDY, r"token ids \(integers\), got a list holding bool"),
    "empty prompt": ("", GREEDY, "empty"),
    "an empty token list in a list": ([[]], GREEDY, "empty"),
    "params not SamplingParams": (PROMPT, {"temperature": 0}, "params must be SamplingParams"),
    "temperature nan (set later)": (PROMPT, tampered(temperature=float("nan")), "temperature must be a finite"),
    "temperature inf (set later)": (PROMPT, tampered(temperature=float("inf")), "temperature must be a finite"),
    "top_k 2.5 (set later)": (PROMPT, tampered(top_k=2.5), "top_k must be an integer"),
    "stop [''] (set later)": (PROMPT, tampered(stop=[""]), "non-empty strings"),
    "stop as a string (set later)": (PROMPT, tampered(stop="ab"), "must be lists"),
    "seed -1 (set later)": (PROMPT, tampered(seed=-1), "seed must be an integer in"),
    "seed 2**70 (set later)": (PROMPT, tampered(seed=2**70), "seed must be an integer in"),
    "logprobs 50 (set later)": (PROMPT, tampered(logprobs=50), "logprobs must be"),
    "max_tokens 0 (set later)": (PROMPT, tampered(max_tokens=0), "max_tokens must be"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_each_bad_call_gets_one_line_and_the_llm_stays_as_fresh(embedded_llm, reference, case):
    prompt, params, match = BAD_CALLS[case]
    with pytest.raises((ValueError, TypeError), match=match) as e:  # TypeError: a prompt of the wrong type
        embedded_llm.generate(prompt, params)
    assert "\n" not in str(e.value)
    assert_clean(embedded_llm, reference)


@pytest.mark.parametrize("kw, match", [
    (dict(max_num_seqs=0), "max_num_seqs must be an integer >= 1"),
    (dict(max_num_batched_tokens=0), "max_num_batched_tokens must be"),
    (dict(kv_cache_gib=0), "kv_cache_gib must be a finite number"),
    (dict(kv_cache_gib=-2), "kv_cache_gib must be a finite number"),
    (dict(block_size=0), "block_size must be an integer >= 1"),
    (dict(max_model_len=10**6), "max_model_len 1000000 exceeds the model's context"),
    (dict(num_threads=0), "num_threads"),
    (dict(speculative=dict(method="lookup", lookup_max_ngram=0)), "lookup_max_ngram must be an integer >= 1"),
])
def test_bad_engine_settings_are_refused_in_one_line(kw, match):
    with pytest.raises(ValueError, match=match) as e:
        LLM(**kw)
    assert "\n" not in str(e.value)


def test_a_request_the_cache_can_never_hold_is_refused_at_admission(reference):
    """Refused before any token (not after producing some, output lost), naming the setting; the same
    LLM then serves requests that fit, identically to a fresh one."""
    llm = LLM(kv_cache_gib=0.01)  # 14 blocks of 16 tokens
    with pytest.raises(ValueError, match=r"needs \d+ KV blocks but the cache has 14; raise kv_cache_gib") as e:
        llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=500))
    assert "\n" not in str(e.value)
    assert_clean(llm, reference)
    # the same request with its context capped: max_tokens beyond the context cannot make it bigger
    small = LLM(kv_cache_gib=0.01, max_model_len=64)
    out = small.generate(PROMPT, dataclasses.replace(GREEDY, max_tokens=10_000, ignore_eos=True))[0].outputs[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 64 - len(small.tokenizer.encode(PROMPT))
    assert_clean(small, reference)


def test_a_bad_prompt_late_in_the_list_queues_nothing(embedded_llm, reference):
    vocab = embedded_llm.engine.arch.vocab_size
    for bad, match in (([1, vocab], r"token ids must be in \[0"), ([1, 2.5], r"token ids \(integers\)"), ([], "empty")):
        with pytest.raises((ValueError, TypeError), match=match):
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


@pytest.mark.filterwarnings("ignore:LLM.generate runs on another thread")  # expected here: slower, same tokens
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


def test_generate_off_the_building_thread_warns_once_and_answers_the_same():
    """Steps on another thread than the LLM's builder run slower on CPU (a second OpenMP pool:
    docs/decisions.md#engine-thread): say so once, pointing at AsyncLLM; the tokens do not change."""
    import torch
    before = torch.get_num_threads()
    try:  # pinned counts (the governor of a shared LLM may have left the process at one thread)
        pinned = LLM(kv_cache_gib=0.125, max_model_len=256, num_threads=1)  # one thread: no pool, nothing to say
        llm = LLM(kv_cache_gib=0.125, max_model_len=256, num_threads=2)
        params = SamplingParams(temperature=0, max_tokens=4)
        ids = lambda m: m.generate("def f(x):", params)[0].outputs[0].token_ids  # noqa: E731
        said, alone = _warned_while(ids, llm)
        assert said == []  # on the building thread
        off = _on_a_thread(lambda: [_warned_while(ids, llm) for _ in range(2)])
        assert len(off[0][0]) == 1 and "AsyncLLM" in off[0][0][0] and "another thread" in off[0][0][0]
        assert off[1][0] == []  # once
        assert [out for _, out in off] == [alone, alone]
        assert _on_a_thread(lambda: _warned_while(ids, pinned))[0] == []
    finally:
        torch.set_num_threads(before)  # the pins are process-wide: give the next tests their threads back


def _warned_while(fn, *args):
    """(the RuntimeWarnings' messages, fn's result)."""
    import warnings
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = fn(*args)
    return [str(x.message) for x in w if issubclass(x.category, RuntimeWarning)], out


def _on_a_thread(fn):
    box, errors = [], []

    def run():
        try:
            box.append(fn())
        except BaseException as e:  # raised again here, not lost with the thread
            errors.append(e)

    th = threading.Thread(target=run)
    th.start()
    th.join(300)
    if errors:
        raise errors[0]
    return box[0]
