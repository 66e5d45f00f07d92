"""The int8-activation mode (issue 37) end to end on the embedded model: within the mode, greedy
speculative decoding gives regular decoding's tokens at batch 1, 8 and 16 (the kernels sum each row in
one order whatever the rows beside it); the mode's text stays close to fp32's; the flag reaches the
engine from the command line.

fallback=False: the cost model must not turn speculation off and make the comparison trivial."""
import pytest

from specserve import LLM, SamplingParams, kernels
from specserve_bench.humaneval import humaneval_prompts

pytestmark = pytest.mark.skipif(not kernels.available(), reason="no block kernels: the mode needs them")

PROMPTS = humaneval_prompts(16)
GREEDY = SamplingParams(temperature=0, max_tokens=24)


@pytest.fixture(scope="module")
def int8_llm():
    return LLM(activations="int8", kv_cache_gib=0.25, max_num_seqs=16)


@pytest.fixture(scope="module")
def reference(int8_llm):
    return [int8_llm.generate(p, GREEDY)[0].outputs[0].token_ids for p in PROMPTS]


def test_every_product_runs_on_the_int8_kernels(int8_llm):
    model = int8_llm.engine.model
    lins = [lin for layer in model.layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)] + [model.lm_head]
    assert all(isinstance(lin.block, kernels.Int8Weight) and lin.dense is None for lin in lins)
    assert all(lin.kernel == "int8" for lin in lins) and int8_llm.engine.weight_kernel == "int8"


@pytest.mark.parametrize("spec", [dict(method="draft", policy="bass"),
                                  dict(method="draft", shape="tree", tree_top_k=3, tree_beam=2),
                                  dict(method="suffix", policy="fixed", draft_len=5)],
                         ids=["eagle-chain", "eagle-tree", "suffix"])
def test_greedy_speculation_equals_regular_decoding_in_the_mode(spec, reference):
    llm = LLM(activations="int8", speculative={**spec, "fallback": False}, kv_cache_gib=0.25, max_num_seqs=16)
    assert [llm.generate(p, GREEDY)[0].outputs[0].token_ids for p in PROMPTS[:4]] == reference[:4]  # batch 1
    for n in (8, 16):
        outs = llm.generate(PROMPTS[:n], GREEDY)
        assert [o.outputs[0].token_ids for o in outs] == reference[:n], n
    stats = llm.spec_stats()
    assert stats["spec_steps"] > 0 and stats["accepted"] > 0  # it really speculated


def test_batched_regular_decoding_equals_batch_one(int8_llm, reference):
    outs = int8_llm.generate(PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == reference


def test_the_mode_stays_close_to_fp32(embedded_llm, reference):
    """Not the same bits (activations are rounded to 8 bits), but mostly the same greedy tokens: at least
    half of the prompts agree on their first 8 tokens."""
    fp32 = [embedded_llm.generate(p, GREEDY)[0].outputs[0].token_ids for p in PROMPTS]
    agree = sum(a[:8] == b[:8] for a, b in zip(fp32, reference))
    assert agree >= len(PROMPTS) // 2, agree


def test_a_prompts_chunking_changes_no_token(reference):
    """Prompt chunks run on the paged kernel in this mode: each row attends its keys in one order however
    the prompt was cut (SDPA's blocking follows the chunk, and 8-bit rounding would amplify its last
    bits), so chunks of 48 give the tokens of one-at-a-time whole prompts (on SDPA they did not: 6 of 16 differed)."""
    llm = LLM(activations="int8", kv_cache_gib=0.25, max_num_seqs=16, prefill_chunk=48)
    assert llm.engine.runner.paged_max_q > max(len(llm.tokenizer.encode(p)) for p in PROMPTS)
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == reference
