"""Speculative decoding on the embedded model is lossless: greedy output is token-identical to regular
decoding for 20 HumanEval prompts at batch 8 (10 of them at batch 1), with PAD and SPLIT attention, with every
draft-length policy and every drafter, as chains and as token trees; seeded sampling repeats; bad
settings fail with one line.

fallback=False everywhere: the cost model must not be allowed to turn speculation off and make the
comparison trivially pass."""
import pytest

from specserve import LLM, SamplingParams
from specserve.loading import embedded_model_path
from specserve_bench.humaneval import humaneval_prompts

PROMPTS = humaneval_prompts(20)
GREEDY = SamplingParams(temperature=0, max_tokens=32)
BATCH1 = 10  # prompts run alone (each 10 of them took a third of a configuration's time); all 20 run batched


@pytest.fixture(scope="module")
def reference(embedded_llm):
    return [embedded_llm.generate(p, GREEDY)[0].outputs[0].token_ids for p in PROMPTS]


CONFIGS = {
    "eagle-bass-split": dict(method="draft", policy="bass", attention="split"),
    "eagle-bass-pad": dict(method="draft", policy="bass", attention="pad"),
    "eagle-fixed3": dict(method="draft", policy="fixed", draft_len=3),
    "eagle-threshold": dict(method="draft", policy="threshold"),
    "eagle-tree-split": dict(method="draft", policy="bass", shape="tree", attention="split"),
    "eagle-tree-pad": dict(method="draft", policy="bass", shape="tree", attention="pad"),
    "eagle-tree-threshold": dict(method="draft", policy="threshold", shape="tree", tree_top_k=3, tree_beam=2),
    "lookup-bass": dict(method="lookup", policy="bass"),
    "lookup-fixed-pad": dict(method="lookup", policy="fixed", draft_len=4, attention="pad"),
    "lookup+draft-bass": dict(method="lookup+draft", policy="bass"),
    "ngram-fixed3": dict(method="ngram", policy="fixed", draft_len=3),
    "ngram-bass-pad": dict(method="ngram", policy="bass", attention="pad"),
    "suffix-bass": dict(method="suffix", policy="bass"),
    "suffix-fixed-pad": dict(method="suffix", policy="fixed", draft_len=6, attention="pad"),
    "suffix+draft-tree": dict(method="suffix+draft", policy="bass", shape="tree"),
    "auto-bass": dict(method="auto", policy="bass"),
    # lookahead decoding: its window and guesses as one tree; the wide one verifies spans longer than
    # the paged kernel takes (up to 29 rows: the SDPA tree-mask path under SPLIT, beside short spans)
    "lookahead-bass": dict(method="lookahead", policy="bass"),
    "lookahead-wide-split": dict(method="lookahead", attention="split", lookahead_window=6, lookahead_ngram=4,
                                 lookahead_guesses=4),
    # staged drafting: the target as a standalone draft model (the only one with this tokenizer here),
    # itself drafted for by lookup / by a second copy drafted for by the n-gram model
    "staged-target-lookup": dict(method="staged", stages=["target", "lookup"], policy="fixed", draft_len=4),
    "staged-3-levels-pad": dict(method="staged", stages=["target", "target", "ngram"], policy="bass", attention="pad"),
}


ORIGINS = {"draft": {"draft"}, "lookup": {"lookup"}, "ngram": {"ngram"}, "lookup+draft": {"lookup", "draft"},
           "staged": {"draft"}, "suffix": {"suffix"}, "suffix+draft": {"suffix", "draft"},
           "auto": {"lookup", "suffix", "draft"}, "lookahead": {"lookahead"}}


# Each method, policy, attention mode and shape stays in `make test` at least once; these variants of
# them run in `make test-all` (the 20 configurations ran over 20 minutes of `make test` on an AVX2-only
# Zen 3); lookahead and staged drafting stay in `make test` in test_guided.py (staged in
# test_prefix_cache.py too), lookup+draft in the seeded test below.
FULL_ONLY = {"eagle-bass-pad", "eagle-fixed3", "eagle-tree-split", "eagle-tree-pad",
             "eagle-tree-threshold", "lookup-bass", "lookup+draft-bass", "ngram-bass-pad", "suffix-fixed-pad",
             "lookahead-bass", "lookahead-wide-split", "staged-target-lookup", "staged-3-levels-pad"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.full) if n in FULL_ONLY else n for n in CONFIGS])
def test_greedy_speculative_equals_regular_decoding(name, reference):
    llm = LLM(speculative={**CONFIGS[name], "fallback": False}, kv_cache_gib=0.25, max_num_seqs=8)
    alone = [llm.generate(p, GREEDY)[0] for p in PROMPTS[:BATCH1]]  # batch 1
    batch8 = llm.generate(PROMPTS, GREEDY)  # 20 prompts, 8 at a time
    assert [a.outputs[0].token_ids for a in alone] == reference[:BATCH1]
    assert [b.outputs[0].token_ids for b in batch8] == reference
    stats = llm.spec_stats()
    assert stats["spec_steps"] > 0 and stats["accepted"] > 0  # it really speculated, and some drafts were accepted
    if CONFIGS[name].get("stages", [None])[0] == "target":  # a stage that is the target runs the loaded one
        assert llm.engine.speculator.drafter.model.model is llm.engine.model
    if CONFIGS[name].get("shape") == "tree":  # trees that branch were verified (a draft that is a chain is sent as one)
        assert stats["tree_spans"] > 0
    for out in alone + batch8:
        o = out.outputs[0]
        assert o.accepted_per_step and all(0 <= a <= d for a, d in zip(o.accepted_per_step, o.drafted_per_step))
        # the first token comes from the prefill; every verify step before the last emitted accepted + 1
        done = o.accepted_per_step[:-1]
        assert sum(done) + len(done) <= len(o.token_ids) - 1
        # origins: the accepted drafts are the drafter's, the rest the target's (the last verify step
        # may have been cut short by max_tokens)
        assert len(o.origins) == len(o.token_ids) and o.origins[0] == "target"
        drafted = [x for x in o.origins if x != "target"]
        assert sum(done) <= len(drafted) <= sum(o.accepted_per_step)
        assert set(drafted) <= ORIGINS[CONFIGS[name]["method"]]


def test_draft_model_drafter_with_the_target_as_its_own_draft_accepts_everything(reference):
    """A separate draft model with its own KV cache and rollback; drafting with the target itself
    must accept every greedy draft, which checks positions, KV and rollback of both caches."""
    llm = LLM(speculative=dict(method="draft", draft_model=embedded_model_path(), policy="fixed", draft_len=3,
                               fallback=False), kv_cache_gib=0.25, max_num_seqs=8)
    assert llm.engine.speculator.drafter.model is llm.engine.model  # the loaded target, not a second copy
    outs = llm.generate(PROMPTS[:8], GREEDY)
    for ref, out in zip(reference, outs):
        o = out.outputs[0]
        assert o.token_ids == ref
        assert all(a == d for a, d in zip(o.accepted_per_step[:-1], o.drafted_per_step[:-1]))
    for p, ref in zip(PROMPTS[8:10], reference[8:10]):
        assert llm.generate(p, GREEDY)[0].outputs[0].token_ids == ref


@pytest.mark.parametrize("method, fallback, shape", [("draft", False, "chain"),
                                                     pytest.param("lookup", False, "chain", marks=pytest.mark.full),
                                                     ("lookup+draft", False, "chain"), ("draft", True, "chain"),
                                                     pytest.param("draft", False, "tree", marks=pytest.mark.full),
                                                     pytest.param("ngram", False, "chain", marks=pytest.mark.full),
                                                     pytest.param("lookahead", False, "chain", marks=pytest.mark.full)])
# (lookup+draft mixes q = one-hot and q = probs)
def test_seeded_sampling_repeats(method, fallback, shape):
    """Same seed, same output, whatever the batch; with the cost-model fallback on too (a seeded
    request's draft lengths follow its own acceptance and the batch-1 calibration only)."""
    llm = LLM(speculative=dict(method=method, fallback=fallback, shape=shape), kv_cache_gib=0.25)
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=5, max_tokens=40, ignore_eos=True)
    a = llm.generate(PROMPTS[:3], params)
    b = llm.generate(PROMPTS[:3], params)
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]
    alone = llm.generate(PROMPTS[1], params)[0]  # same seed, other batch company
    assert alone.outputs[0].token_ids == a[1].outputs[0].token_ids
    crowd = llm.generate(PROMPTS[:8], params)  # a batch of 8: the shared policy sees another batch size
    assert [o.outputs[0].token_ids for o in crowd[:3]] == [o.outputs[0].token_ids for o in a]
    assert len({tuple(o.outputs[0].token_ids) for o in a}) == 3


@pytest.mark.parametrize("spec", [dict(method="lookup"), dict(method="draft", shape="tree")])
def test_top_k_logprobs_of_verified_tokens_equal_regular_decoding(embedded_llm, spec):
    """logprobs=k through the verify pass (a span of 1 + k rows per request; a tree's accepted path)
    gives the same tokens, the same top ids and the same values as plain decoding."""
    params = SamplingParams(temperature=0, max_tokens=24, logprobs=3)
    plain = embedded_llm.generate(PROMPTS[:4], params)
    llm = LLM(speculative=dict(spec, fallback=False), kv_cache_gib=0.25)
    spec = llm.generate(PROMPTS[:4], params)
    assert llm.spec_stats()["accepted"] > 0
    for a, b in zip(plain, spec):
        a, b = a.outputs[0], b.outputs[0]
        assert a.token_ids == b.token_ids and [list(t) for t in a.top_logprobs] == [list(t) for t in b.top_logprobs]
        assert all(abs(x - y) < 1e-4 for x, y in zip(a.logprobs, b.logprobs))
        assert all(abs(s[t] - u[t]) < 1e-4 for s, u in zip(a.top_logprobs, b.top_logprobs) for t in s)


def test_suffix_drafting_drafts_a_repeated_request_from_the_cached_output(reference):
    llm = LLM(speculative=dict(method="suffix", fallback=False), kv_cache_gib=0.25)
    first = llm.generate(PROMPTS[0], GREEDY)[0].outputs[0]
    again = llm.generate(PROMPTS[0], GREEDY)[0].outputs[0]
    assert first.token_ids == again.token_ids == reference[0]
    # the second time the first output is matched, with drafts that grow with the match
    assert again.origins.count("suffix") >= 0.6 * len(again.token_ids) > first.origins.count("suffix")
    assert max(again.accepted_per_step) >= 6


def test_a_request_can_opt_out_of_speculation(reference):
    import dataclasses
    llm = LLM(speculative=dict(method="lookup", fallback=False), kv_cache_gib=0.25)
    out = llm.generate(PROMPTS[:4], dataclasses.replace(GREEDY, speculative=False))
    assert [o.outputs[0].token_ids for o in out] == reference[:4]
    assert llm.spec_stats()["drafted"] == 0
    assert all(set(o.outputs[0].origins) == {"target"} for o in out)
    mixed = llm.generate(PROMPTS[:4], [dataclasses.replace(GREEDY, speculative=False), GREEDY, GREEDY, GREEDY])
    assert [o.outputs[0].token_ids for o in mixed] == reference[:4]
    assert not mixed[0].outputs[0].drafted_per_step and llm.spec_stats()["drafted"] > 0


@pytest.mark.parametrize("spec, message", [
    (dict(method="medusa"), "unknown speculative method"),
    (dict(draft_len=0), "draft_len must be"),
    (dict(draft_len=-3), "draft_len must be"),
    (dict(policy="greedy"), "unknown draft-length policy"),
    (dict(attention="flash"), "unknown speculative attention"),
    (dict(speed="max"), "unknown speculative option"),
    (dict(lookup_max_ngram=0), "lookup_max_ngram must be an integer >= 1"),
    (dict(lookup_max_ngram=2.5), "lookup_max_ngram must be an integer >= 1"),
    (dict(fallback="no"), "fallback must be True or False"),
    (dict(shape="forest"), "unknown draft shape"),
    (dict(tree_top_k=0), "tree_top_k must be an integer >= 1"),
    (dict(method="staged", stages=["draft"]), "at least two stages"),
    (dict(method="staged", stages=["ngram", "draft"]), "only the last stage may be"),
    (dict(method="staged", stages=["draft", "ngram"]), "cannot be staged"),  # the shipped draft is an EAGLE draft
    (dict(method="staged", stages=["/no/such/model", "ngram"]), "no such model"),
])
def test_bad_settings_fail_with_one_line(spec, message):
    with pytest.raises(ValueError, match=message) as e:
        LLM(speculative=spec)
    assert "\n" not in str(e.value)


def test_draft_with_another_tokenizer_is_refused(tmp_path):
    from tests.model.tiny import make_tiny
    pytest.importorskip("transformers")
    make_tiny("llama", str(tmp_path))
    with pytest.raises(ValueError, match="tokenizer") as e:
        LLM(speculative=dict(method="draft", draft_model=str(tmp_path)), kv_cache_gib=0.1)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_drafts_stop_where_the_request_ends(embedded_llm, shape):
    """max_tokens=3: the prompt's step gives the first token, so one verify step with one draft token
    can give the other two; a longer draft would be computed and thrown away."""
    short = SamplingParams(temperature=0, max_tokens=3)
    ref = [o.outputs[0].token_ids for o in embedded_llm.generate(PROMPTS[:6], short)]
    llm = LLM(speculative=dict(method="draft", policy="fixed", draft_len=8, fallback=False, shape=shape),
              kv_cache_gib=0.25, max_num_seqs=8)
    outs = llm.generate(PROMPTS[:6], short)
    assert [o.outputs[0].token_ids for o in outs] == ref
    width = 1 if shape == "chain" else llm.engine.speculator.tree.top_k  # a tree of depth 1: the root's children
    assert all(max(o.outputs[0].drafted_per_step, default=0) <= width for o in outs)
    assert 0 < llm.spec_stats()["drafted"] <= 6 * width
