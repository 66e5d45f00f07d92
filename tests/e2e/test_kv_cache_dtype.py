"""--kv-cache-dtype float16 end to end on the embedded model: the cache holds f16 (twice the blocks in
the same GiB); within the mode greedy speculation gives regular decoding's tokens at batch 1 and 8, a
batch gives batch one's tokens, and a prefix-cache hit gives a cold prompt's (every path reads the same
rounded keys and the paged kernel sums each row in one order); the text stays close to the f32 cache's;
the flag reaches the engine; it is refused where only f32/bf16 caches run."""
import pytest
import torch

from specserve import LLM, kernels
from specserve.cli.engine_args import llm_kwargs
from specserve.cli.main import build_parser
from specserve.config import CacheConfig
from specserve.kv.cache import KVCache
from specserve_bench.humaneval import humaneval_prompts

from .mode_checks import GREEDY, SPECS, assert_speculation_gives, one_at_a_time, speculating

needs_kernels = pytest.mark.skipif(not kernels.available(), reason="no block kernels: the f16 cache is the paged kernel's")

PROMPTS = humaneval_prompts(8)


@pytest.fixture(scope="module")
def f16_llm():
    return LLM(kv_cache_dtype="float16", kv_cache_gib=0.25, max_num_seqs=8)


@pytest.fixture(scope="module")
def reference(f16_llm):
    return one_at_a_time(f16_llm, PROMPTS)


@needs_kernels
def test_the_cache_holds_f16_and_twice_the_blocks(f16_llm):
    e = f16_llm.engine
    assert e.kv.k.dtype == e.kv.v.dtype == torch.float16 and e.model.dtype == torch.float32
    arch = e.arch
    f32_block = KVCache.bytes_per_block(arch.num_hidden_layers, 16, arch.num_key_value_heads, arch.head_dim, torch.float32)
    assert e.kv.num_blocks == int(0.25 * 2**30) // (f32_block // 2) and e.kv.num_blocks >= 2 * (int(0.25 * 2**30) // f32_block)


@needs_kernels
@pytest.mark.parametrize("spec", SPECS.values(), ids=SPECS.keys())
def test_greedy_speculation_equals_regular_decoding_in_the_mode(spec, reference):
    llm = speculating(spec, kv_cache_dtype="float16", max_num_seqs=8)
    if spec["method"] == "draft":  # the draft's own cache takes the target's cache type too
        assert llm.engine.speculator.drafter.kv.cache.k.dtype == torch.float16
    assert_speculation_gives(llm, PROMPTS, reference, alone=3, batches=(8,))


@needs_kernels
def test_a_batch_and_a_prefix_cache_hit_change_no_token(f16_llm, reference):
    outs = f16_llm.generate(PROMPTS, GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == reference
    again = f16_llm.generate(PROMPTS[0], GREEDY)[0]  # its prompt's blocks are cached by now
    assert again.num_cached_tokens > 0 and again.outputs[0].token_ids == reference[0]


@needs_kernels
def test_the_mode_stays_close_to_the_f32_cache(embedded_llm, reference):
    """Not the same bits (each key and value keeps 11 significant bits), but mostly the same greedy
    tokens: at least 6 of the 8 prompts agree on their first 8 tokens."""
    f32 = [embedded_llm.generate(p, GREEDY)[0].outputs[0].token_ids for p in PROMPTS]
    agree = sum(a[:8] == b[:8] for a, b in zip(f32, reference))
    assert agree >= 6, agree


def test_the_flag_reaches_the_engine():
    args = build_parser().parse_args(["generate", "x", "--kv-cache-dtype", "float16"])
    assert llm_kwargs(args)["kv_cache_dtype"] == "float16"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "x", "--kv-cache-dtype", "int4"])


def test_refused_where_it_cannot_run():
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        CacheConfig(kv_cache_dtype="int8")
    with pytest.raises(ValueError, match="kv_cache_dtype float16 is for float32 models .this one runs bfloat16.: add --dtype float32"):
        LLM(kv_cache_dtype="float16", dtype="bfloat16", kv_cache_gib=0.1)
