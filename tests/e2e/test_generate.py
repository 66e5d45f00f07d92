"""End to end on the embedded model: batching, n samples, seeds, stops, chat."""
from specserve import SamplingParams
from specserve_bench.humaneval import humaneval_prompts


def test_greedy_batch8_equals_each_alone(embedded_llm):
    prompts = [p for p in humaneval_prompts(20)][::2][:8]
    lens = {len(embedded_llm.tokenizer.encode(p)) for p in prompts}
    assert len(lens) == 8  # different lengths: a ragged batch
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    batched = embedded_llm.generate(prompts, params)
    for p, b in zip(prompts, batched):
        alone = embedded_llm.generate(p, params)[0]
        assert b.outputs[0].token_ids == alone.outputs[0].token_ids


def test_n_samples_share_prompt_and_match_seeded_singles(embedded_llm):
    prompt = humaneval_prompts(1)[0]
    params = SamplingParams(n=3, temperature=0.7, seed=11, max_tokens=24, ignore_eos=True)
    out = embedded_llm.generate(prompt, params)[0]
    again = embedded_llm.generate(prompt, params)[0]
    assert [o.token_ids for o in out.outputs] == [o.token_ids for o in again.outputs]
    assert len({tuple(o.token_ids) for o in out.outputs}) > 1  # samples differ
    for i, o in enumerate(out.outputs):  # sample i == a lone request seeded seed + i
        single = embedded_llm.generate(prompt, SamplingParams(temperature=0.7, seed=11 + i, max_tokens=24,
                                                               ignore_eos=True))[0]
        assert single.outputs[0].token_ids == o.token_ids


def test_stop_strings_max_tokens_and_logprobs(embedded_llm):
    out = embedded_llm.generate("def add(a, b):", SamplingParams(temperature=0, max_tokens=40, stop=["# Example"],
                                                                  logprobs=True))[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == "# Example"
    assert out.text == "\n    a += b\n\n"  # what greedy writes before the stop string, which is cut
    assert len(out.logprobs) == len(out.token_ids) and all(lp <= 0 for lp in out.logprobs)
    out = embedded_llm.generate("def add(a, b):", SamplingParams(temperature=0, max_tokens=5))[0].outputs[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 5
    assert out.time_to_first_token > 0 and out.per_token_latency > 0


def test_top_k_logprobs_match_a_fresh_prefill_at_every_position(embedded_llm):
    """logprobs=k (vLLM's meaning): each position's k most likely tokens with their log-probabilities.
    The decode steps' values equal those of a prefill of the same prefix (another code path)."""
    prompt = embedded_llm.tokenizer.encode("def add(a, b):")
    out = embedded_llm.generate(prompt, SamplingParams(temperature=0, max_tokens=6, logprobs=5))[0].outputs[0]
    assert len(out.top_logprobs) == len(out.token_ids) == len(out.logprobs)
    for i, (tok, lp, top) in enumerate(zip(out.token_ids, out.logprobs, out.top_logprobs)):
        ids, vals = list(top), list(top.values())
        assert len(top) == 5 and ids[0] == tok and vals == sorted(vals, reverse=True) and abs(vals[0] - lp) < 1e-6
        fresh = embedded_llm.generate(prompt + out.token_ids[:i], SamplingParams(temperature=0, max_tokens=1, logprobs=5))
        ftop = fresh[0].outputs[0].top_logprobs[0]
        assert list(ftop) == ids and all(abs(ftop[t] - top[t]) < 1e-4 for t in ids)


def test_chat_uses_template_and_stops_at_eos(embedded_llm):
    out = embedded_llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                            SamplingParams(temperature=0, max_tokens=64))[0].outputs[0]
    assert "Paris" in out.text
    assert out.finish_reason == "stop" and out.token_ids[-1] in embedded_llm.tokenizer.eos_token_ids


def test_n_samples_finishing_at_once_free_every_block(embedded_llm):
    blocks = embedded_llm.engine.scheduler.blocks
    free_before = blocks.num_free_blocks
    out = embedded_llm.generate("def add(a, b):", SamplingParams(n=4, temperature=1.0, seed=3, max_tokens=1))[0]
    assert [len(o.token_ids) for o in out.outputs] == [1, 1, 1, 1]
    out = embedded_llm.generate("def add(a, b):", SamplingParams(n=3, temperature=1.0, seed=3, max_tokens=5))[0]
    assert all(len(o.token_ids) == 5 for o in out.outputs)
    assert blocks.num_free_blocks == free_before and not embedded_llm.engine.has_unfinished()


def test_chunked_prefill_and_preemption_change_nothing(embedded_llm):
    """A tiny KV cache (forcing preemption and recompute) and a small token budget (forcing chunked
    prefill and mixed prefill/decode steps) give the same greedy tokens as the roomy default engine."""
    from specserve import LLM

    prompts = humaneval_prompts(4)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    ref = [o.outputs[0].token_ids for o in embedded_llm.generate(prompts, params)]
    per_block = 2 * 30 * 16 * 3 * 64 * 4  # SmolLM2: layers x (K, V) x block x kv heads x head dim x fp32
    tight = LLM(kv_cache_gib=22 * per_block / 2**30, max_num_batched_tokens=48)
    assert tight.engine.kv.num_blocks == 22  # 4 prompts of ~100-130 tokens need ~32 blocks together
    preempted = []
    step = tight.engine.scheduler.schedule

    def spy(*args, **kwargs):  # schedule(drafts)
        out = step(*args, **kwargs)
        preempted.extend(out.preempted)
        return out

    tight.engine.scheduler.schedule = spy
    got = [o.outputs[0].token_ids for o in tight.generate(prompts, params)]
    assert preempted, "the cache was meant to be too small to hold every sequence"
    assert got == ref


def test_prompt_logprobs_score_every_prompt_token_whatever_the_chunking_the_cache_and_n(embedded_llm):
    from specserve import LLM
    prompt = humaneval_prompts(1)[0]
    greedy = SamplingParams(temperature=0, max_tokens=6, prompt_logprobs=3)
    whole = embedded_llm.generate(prompt, greedy)[0]
    P = len(whole.prompt_token_ids)
    assert P > 40 and len(whole.prompt_logprobs) == P and len(whole.prompt_top_logprobs) == P
    assert whole.prompt_logprobs[0] is None and all(lp <= 0 for lp in whole.prompt_logprobs[1:])
    for tok, lp, top in zip(whole.prompt_token_ids[1:], whole.prompt_logprobs[1:], whole.prompt_top_logprobs[1:]):
        assert len(top) == 3 and list(top.values()) == sorted(top.values(), reverse=True)
        assert (tok in top and top[tok] == lp) or lp <= min(top.values())
    plain = embedded_llm.generate(prompt, SamplingParams(temperature=0, max_tokens=6))[0]
    assert plain.prompt_logprobs is None and plain.num_cached_tokens > 0  # cached now, so the next one must not use it
    again = embedded_llm.generate(prompt, greedy)[0]
    assert again.num_cached_tokens == 0 and again.prompt_logprobs == whole.prompt_logprobs
    assert whole.outputs[0].token_ids == plain.outputs[0].token_ids  # scoring the prompt changes no output
    samples = embedded_llm.generate(prompt, SamplingParams(n=2, temperature=0.8, seed=3, max_tokens=4, prompt_logprobs=0))[0]
    assert samples.prompt_logprobs == whole.prompt_logprobs and samples.prompt_top_logprobs is None
    chunked = LLM(kv_cache_gib=0.1, prefill_chunk=16).generate(prompt, greedy)[0]  # SARATHI chunks of 16 rows
    assert len(chunked.prompt_logprobs) == P
    assert max(abs(a - b) for a, b in zip(chunked.prompt_logprobs[1:], whole.prompt_logprobs[1:])) < 1e-4
    assert chunked.outputs[0].token_ids == whole.outputs[0].token_ids
    # speculation: drafts ride after the prompt, never in its scored rows
    spec = LLM(kv_cache_gib=0.1, speculative="suffix").generate([prompt, prompt], greedy)
    for out in spec:
        assert out.prompt_logprobs == whole.prompt_logprobs and out.outputs[0].token_ids == whole.outputs[0].token_ids
