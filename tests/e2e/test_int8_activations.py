"""The int8-activation mode (issue 37) end to end on the embedded model: within the mode, greedy
speculative decoding gives regular decoding's tokens at batch 1, 8 and 16 (the kernels sum each row in
one order whatever the rows beside it); the mode's text stays close to fp32's; the flag reaches the
engine from the command line."""
import pytest

from specserve import LLM, kernels
from specserve_bench.humaneval import humaneval_prompts

from .mode_checks import GREEDY, SPECS, assert_speculation_gives, one_at_a_time, speculating

pytestmark = pytest.mark.skipif(not kernels.available(), reason="no block kernels: the mode needs them")

PROMPTS = humaneval_prompts(16)


@pytest.fixture(scope="module")
def int8_llm():
    return LLM(activations="int8", kv_cache_gib=0.25, max_num_seqs=16)


@pytest.fixture(scope="module")
def reference(int8_llm):
    return one_at_a_time(int8_llm, PROMPTS)


def test_every_product_runs_on_the_int8_kernels(int8_llm):
    model = int8_llm.engine.model
    lins = [lin for layer in model.layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)] + [model.lm_head]
    assert all(isinstance(lin.block, kernels.Int8Weight) and lin.dense is None for lin in lins)
    assert all(lin.kernel == "int8" for lin in lins) and int8_llm.engine.weight_kernel == "int8"


@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_greedy_speculation_equals_regular_decoding_in_the_mode(spec, reference):
    llm = speculating(spec, activations="int8", max_num_seqs=16)
    assert_speculation_gives(llm, PROMPTS, reference, alone=4, batches=(8, 16))


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
