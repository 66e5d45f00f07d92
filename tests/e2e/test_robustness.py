"""The engine survives bad input, failures, interrupts and concurrent callers: each case gets its
one-line error (or the right answer), and afterwards the same LLM produces output token-identical to
what it produced before (the engine is deterministic for greedy and seeded requests)."""
import dataclasses
import sys
import threading

import pytest

from specserve import LLM, SamplingParams
from specserve.types import FinishReason
from tests.os_threads import on_a_thread

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


@pytest.mark.filterwarnings("ignore:LLM.generate runs on another thread")  # where pools cannot be freed: same tokens
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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names from /proc (Linux)")
def test_an_llm_leaves_no_openmp_pool_on_the_threads_that_built_or_stepped_it(monkeypatch):
    """libgomp keeps an OpenMP pool per thread, and a second pool beside the stepping thread's made every
    step 1.7x slower on 2 cores (docs/decisions.md#omp-pools). So the building thread's pool goes once
    the LLM is built, and each caller's when generate returns (engine/omp_pool.py): generate on another
    thread (a web handler's) says nothing and answers the same. Where pools cannot be freed, the first
    such call says once that it is slower, pointing at AsyncLLM (checked with the freeing switched off,
    which also shows the pools the test counts are there). A pool's workers carry the name of the thread
    that started them (tests/os_threads.py)."""
    import torch

    from specserve.engine import llm as llm_module
    from specserve.engine.omp_pool import can_free_pools
    from tests.os_threads import name_this_thread, threads_named

    if not can_free_pools():
        pytest.skip("no libgomp with OpenMP 5.0's pause here")
    before = torch.get_num_threads()
    params = SamplingParams(temperature=0, max_tokens=4)
    ids = lambda m: m.generate("def f(x):", params)[0].outputs[0].token_ids  # noqa: E731

    def build(name, settle_to):
        """An LLM built on a thread called `name` that stays alive (as a program's main thread does) until
        the test ends, and the count of threads with that name once it is built."""
        built, done = [], threading.Event()

        def run():
            torch.set_num_threads(2)  # before the name: pthreadpool's workers, which it starts, keep the old one
            name_this_thread(name)
            try:
                llm = LLM(kv_cache_gib=0.125, max_model_len=256, num_threads=2)  # pinned: a pool of one worker
                built.append((llm, threads_named(name, settle_to)))
            except BaseException as e:
                built.append(e)
            done.wait(300)

        th = threading.Thread(target=run, daemon=True)
        th.start()
        alive.append((th, done))
        while not built and th.is_alive():
            th.join(0.05)
        if isinstance(built[0], BaseException):
            raise built[0]
        return built[0]

    def step(llm, name):
        torch.set_num_threads(2)
        name_this_thread(name)
        during = []
        out = llm.generate("def f(x):", params, on_text=lambda *_: during.append(threads_named(name)))
        return out[0].outputs[0].token_ids, max(during), threads_named(name, settle_to=1)

    alive = []
    try:
        llm, builder_left = build("spc-build", 1)
        assert builder_left == 1  # the builder alone, its worker gone
        alone = ids(llm)  # first here: the process-wide pools a first generate starts (the tokenizer's) take this name
        said, (off, pooled, stepper_left) = on_a_thread(lambda: _warned_while(step, llm, "spc-step"))
        assert said == [] and pooled == 2 and stepper_left == 1  # a pool while stepping, none after
        assert off == alone  # the tokens do not depend on the thread

        monkeypatch.setattr(llm_module, "free_thread_pool", lambda refresh=False: False)
        kept, kept_left = build("spc-keep", 2)
        assert kept_left == 2  # what the count above would read without the freeing
        off = on_a_thread(lambda: [_warned_while(ids, kept) for _ in range(2)])
        assert len(off[0][0]) == 1 and "AsyncLLM" in off[0][0][0] and "another thread" in off[0][0][0]
        assert off[1][0] == []  # once
        assert off[0][1] == off[1][1] == alone
    finally:
        for th, done in alive:
            done.set()
            th.join(60)
        torch.set_num_threads(before)  # the pins are process-wide: give the next tests their threads back


def test_each_llm_steps_with_its_own_thread_count_on_any_thread():
    """libgomp keeps the thread count per thread, and torch.set_num_threads sets the calling thread's: an
    LLM pinned to one thread, built before one pinned to two on the same thread, stepped with two, and on
    another thread with whatever that thread had. Each step now sets its engine's count where the thread
    has another; outputs do not depend on it."""
    import torch

    before = torch.get_num_threads()
    params = SamplingParams(temperature=0, max_tokens=4)

    def counts(llm):
        seen = []
        out = llm.generate("def f(x):", params, on_text=lambda *_: seen.append(torch.get_num_threads()))
        return sorted(set(seen)), out[0].outputs[0].token_ids

    try:
        one = LLM(kv_cache_gib=0.125, max_model_len=256, num_threads=1)
        two = LLM(kv_cache_gib=0.125, max_model_len=256, num_threads=2)  # this thread's count is 2 now
        (c1, ids1), (c2, ids2) = counts(one), counts(two)
        assert (c1, c2) == ([1], [2])
        assert ids1 == ids2
        torch.set_num_threads(2)
        assert on_a_thread(lambda: counts(one)) == ([1], ids1)  # a new thread starts at torch's last count
        torch.set_num_threads(1)
        assert on_a_thread(lambda: counts(two)) == ([2], ids1)
    finally:
        torch.set_num_threads(before)


def _warned_while(fn, *args):
    """(the RuntimeWarnings' messages, fn's result)."""
    import warnings
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = fn(*args)
    return [str(x.message) for x in w if issubclass(x.category, RuntimeWarning)], out
