"""Prefix caching on the embedded model: the same tokens with and without it, request for request
(shared system prompt, a second chat turn, batched, seeded sampling, a cache small enough to evict
and preempt, speculation), and the cached share actually skipped."""
import inspect
import json

import pytest

from specserve import LLM, SamplingParams

SYSTEM = "Answer questions about this code.\n\n" + inspect.getsource(json)[:1200]
QUESTIONS = ["What does this module do?", "Name one function.", "Is it fast?", "Who wrote it?"]


def _conv(q):
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]


@pytest.fixture(scope="module")
def uncached():
    return LLM(kv_cache_gib=0.25, enable_prefix_caching=False)


def _run(llm):
    """Sequential questions, a second turn, a batch, and seeded samples: (token ids, cached tokens)."""
    greedy = SamplingParams(temperature=0, max_tokens=24)
    outs = [llm.chat(_conv(q), greedy)[0] for q in QUESTIONS[:2]]
    turn2 = _conv(QUESTIONS[0]) + [{"role": "assistant", "content": outs[0].outputs[0].text},
                                    {"role": "user", "content": "Say more."}]
    outs.append(llm.chat(turn2, greedy)[0])
    outs += llm.chat([_conv(q) for q in QUESTIONS], greedy)
    outs += llm.chat([_conv(QUESTIONS[2])], SamplingParams(temperature=1.0, n=2, seed=7, max_tokens=16))
    return [[o.token_ids for o in r.outputs] for r in outs], [r.num_cached_tokens for r in outs]


def test_prefix_caching_changes_no_token(uncached):
    cached = LLM(kv_cache_gib=0.25)
    assert cached.engine.prefix_caching
    want, none = _run(uncached)
    got, hits = _run(cached)
    assert got == want
    assert none == [0] * len(none)
    prompt = len(cached.tokenizer.encode(cached.tokenizer.apply_chat_template(_conv(QUESTIONS[1])), add_special_tokens=False))
    assert hits[0] == 0 and hits[1] >= prompt - 40  # the system prompt's blocks: all but the question's
    assert hits[2] > hits[1]  # the second turn: the first turn's prompt and answer too
    assert min(hits[3:]) > 0


def test_eviction_and_preemption_with_a_small_cache_change_no_token(uncached, monkeypatch):
    """40 blocks of 16 tokens: four ~450-token prompts sharing 27 blocks, 80 tokens each, preempt
    (2 preemptions, 30 evictions when this was written); the outputs stay those of an engine with
    room for all four and no cache."""
    a = LLM(kv_cache_gib=0.028)
    sched, bm = a.engine.scheduler, a.engine.scheduler.blocks
    assert bm.num_blocks == 40
    preempted, taken = [], []
    monkeypatch.setattr(sched, "_preempt", lambda req, out, f=sched._preempt: (preempted.append(req), f(req, out)))
    monkeypatch.setattr(bm, "_unregister", lambda b, f=bm._unregister: (taken.append(b), f(b)))
    greedy = SamplingParams(temperature=0, max_tokens=80)
    want = [o.outputs[0].token_ids for o in uncached.chat([_conv(q) for q in QUESTIONS], greedy)]
    for _ in range(2):  # the second round starts from what the first left cached
        got = [o.outputs[0].token_ids for o in a.chat([_conv(q) for q in QUESTIONS], greedy)]
        assert got == want
    assert preempted and taken  # else this tests neither
    assert bm.num_free_blocks == bm.num_blocks and bm.num_cached_blocks > 0


@pytest.mark.parametrize("spec", [dict(method="lookup"), pytest.param(dict(method="suffix"), marks=pytest.mark.full),
                                  # staged drafting's make-test twin is in test_guided.py
                                  pytest.param(dict(method="staged", stages=["target", "lookup"], policy="fixed",
                                                    draft_len=3), marks=pytest.mark.full)])
def test_prefix_caching_with_speculation_changes_no_token(spec, uncached):
    llm = LLM(kv_cache_gib=0.25, speculative={**spec, "fallback": False})
    assert llm.engine.prefix_caching
    greedy = SamplingParams(temperature=0, max_tokens=32)
    convs = [_conv(q) for q in QUESTIONS[:3]]
    want = [o.outputs[0].token_ids for o in uncached.chat(convs, greedy)]
    first = [llm.chat(c, greedy)[0] for c in convs]
    assert [o.outputs[0].token_ids for o in first] == want and first[-1].num_cached_tokens > 0


def test_eagle_drafts_from_the_features_kept_beside_the_cache(uncached):
    """EAGLE drafts from the target's hidden state at every position: a prefix-cache hit skips those
    positions, so the KV keeps their features. Cached, the drafts (and what was accepted of them, step
    by step) are those of an engine without the cache, and the tokens those of regular decoding."""
    spec = dict(method="draft", policy="fixed", draft_len=3, fallback=False)
    runs = []
    for caching in (True, False):
        llm = LLM(kv_cache_gib=0.25, prefill_chunk=16, enable_prefix_caching=caching, speculative=spec)
        assert llm.engine.prefix_caching == caching and (llm.engine.kv.features is not None) == caching
        greedy = SamplingParams(temperature=0, max_tokens=32)
        runs.append([llm.chat(_conv(q), greedy)[0] for q in QUESTIONS[:3]])
    cached, cold = runs
    want = [o.outputs[0].token_ids for o in uncached.chat([_conv(q) for q in QUESTIONS[:3]], SamplingParams(temperature=0, max_tokens=32))]
    assert [o.outputs[0].token_ids for o in cached] == want
    assert min(o.num_cached_tokens for o in cached[1:]) > 0 and cold[-1].num_cached_tokens == 0
    for a, b in zip(cached, cold):
        assert a.outputs[0].drafted_per_step == b.outputs[0].drafted_per_step
        assert a.outputs[0].accepted_per_step == b.outputs[0].accepted_per_step
    assert sum(cached[-1].outputs[0].accepted_per_step) > 0
