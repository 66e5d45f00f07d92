"""Greedy rounds on the device (cuda/rounds.py, engine/rounds.py) inside the whole engine, on CPU (the
round bodies run uncaptured, with the torch references of the fused ops): regular decoding's and
EAGLE's rounds give the eager engine's regular-decoding tokens, whatever the batch, the requests'
lengths and stops, and leave the engine able to go on with ordinary steps."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: its kernels run on CPU

import pytest  # noqa: E402

from specserve import LLM, SamplingParams  # noqa: E402
from specserve.attention import triton_paged  # noqa: E402
from specserve.cuda.eagle_graph import EagleChainGraphs  # noqa: E402
from specserve.engine import rounds  # noqa: E402
from specserve.engine.graph_runner import GraphModelRunner  # noqa: E402

PROMPTS = ["def fibonacci(n):", "The capital of France is", "import numpy as np\n", "class Stack:", "SELECT name FROM"]
KW = dict(block_kernels=False, max_model_len=512, prefill_chunk=None, kv_cache_gib=0.05)


def _with_rounds(llm: LLM, max_rounds: int, draft_len: int = 3, beam: int = 1, top_k: int = 1, triton: bool = False):
    """What LLMEngine builds on CUDA with cuda_rounds: the graph runner, EAGLE's graph passes, the rounds
    (beam > 1: what shape "tree" with tree_beam = beam and tree_top_k = top_k asks for; triton: the
    fused Triton kernels, under the interpreter, instead of their torch references)."""
    eng = llm.engine
    eager = eng.runner
    eng.runner = GraphModelRunner(eager.model, eager.kv, eager.device, eager.attention, eager.plain_attention,
                                  max_seqs=8, max_model_len=512, max_graph_tokens=32 * beam, max_step_tokens=256,
                                  use_triton=triton)
    if eng.speculator is not None:
        d = eng.speculator.drafter
        d.chain_graphs = EagleChainGraphs(d, 8, 512, capture=False, use_triton=triton)
        eng.config.speculative.draft_len = draft_len
        if beam > 1:
            sc = eng.config.speculative
            sc.shape, sc.tree_beam, sc.tree_top_k = "tree", beam, top_k
    eng.rounds = rounds.build(eng.runner, eng.speculator, max_rounds, eng.config)
    return eng.rounds


def _tokens(llm, prompts, params):
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


# two of the four in `make test` (time on an AVX2-only Zen 3): each method once, each caching once
@pytest.mark.parametrize("method, caching", [(None, True), ("draft", False),
                                             pytest.param(None, False, marks=pytest.mark.full),
                                             pytest.param("draft", True, marks=pytest.mark.full)])
def test_rounds_give_regular_decodings_tokens(method, caching):
    params = [SamplingParams(temperature=0, max_tokens=n) for n in (23, 9, 30, 17, 12)]  # 5 rows: padded to 6
    plain = LLM(enable_prefix_caching=caching, **KW)
    ref = _tokens(plain, PROMPTS, params)
    ref1 = _tokens(plain, PROMPTS[1:2], params[2])
    spec = None if method is None else {"method": method, "fallback": False}
    llm = LLM(enable_prefix_caching=caching, speculative=spec, **KW)
    r = _with_rounds(llm, max_rounds=4)
    assert _tokens(llm, PROMPTS, params) == ref
    assert _tokens(llm, PROMPTS[1:2], params[2]) == ref1  # batch 1, after the batch (a prefix-cache hit)
    assert r.dev.rounds > 0 and r.time > 0  # the decodes went through the rounds
    if method is not None:
        assert r.dev.drafted > 0 and 0 < r.dev.accepted <= r.dev.drafted
        stats = llm.spec_stats()
        assert stats["spec_steps"] == 0  # the draft fed the prompts' features: rounds started after the prefill
        st = stats["device_rounds"]
        assert (st["rounds"], st["drafted"], st["accepted"]) == (r.dev.rounds, r.dev.drafted, r.dev.accepted)
        llm.reset_spec_stats()
        assert llm.spec_stats()["device_rounds"]["rounds"] == 0


@pytest.mark.parametrize("caching,top_k", [pytest.param(False, 3, marks=pytest.mark.full), (True, 3),
                                           pytest.param(False, 1, marks=pytest.mark.full)])
def test_tree_rounds_give_regular_decodings_tokens(caching, top_k):
    """Rounds of token trees, 3 levels of 3 nodes (top_k 1: three chains from the draft's best three
    first tokens): the accepted nodes' K/V move from the tree's rows to their positions; the output is
    regular decoding's, at batch 5 (padded to 6) and 1."""
    params = [SamplingParams(temperature=0, max_tokens=n) for n in (23, 9, 30, 17, 12)]
    plain = LLM(enable_prefix_caching=caching, **KW)
    ref = _tokens(plain, PROMPTS, params)
    ref1 = _tokens(plain, PROMPTS[1:2], params[2])
    llm = LLM(enable_prefix_caching=caching, speculative={"method": "draft", "fallback": False}, **KW)
    r = _with_rounds(llm, max_rounds=4, draft_len=3, beam=3, top_k=top_k)
    assert (r.dev.W, r.dev.Rv, r.dev.max_seqs) == (3, 10, 8)
    assert _tokens(llm, PROMPTS, params) == ref
    assert _tokens(llm, PROMPTS[1:2], params[2]) == ref1
    assert r.dev.rounds > 0 and 0 < r.dev.accepted <= r.dev.drafted
    assert int(r.dev.moved) > 0  # accepted nodes came from the tree's rows: their K/V were moved
    assert llm.engine.scheduler.blocks.num_free_blocks == llm.engine.scheduler.blocks.num_blocks


@pytest.mark.full
@pytest.mark.skipif(not triton_paged.available(), reason="triton not installed (pip install '.[gpu-test]')")
def test_tree_rounds_through_the_triton_kernels():
    """The same through the Triton kernels the GPU runs (attention with the draft's and the target's
    tree masks, RoPE and KV writes, norms), under the interpreter: two requests, 12 and 7 tokens."""
    params = [SamplingParams(temperature=0, max_tokens=n) for n in (12, 7)]
    ref = _tokens(LLM(**KW), PROMPTS[:2], params)
    llm = LLM(speculative={"method": "draft", "fallback": False}, **KW)
    r = _with_rounds(llm, max_rounds=4, draft_len=3, beam=3, top_k=3, triton=True)
    assert _tokens(llm, PROMPTS[:2], params) == ref
    assert r.dev.rounds > 0 and int(r.dev.moved) > 0


def test_rounds_stop_where_regular_decoding_stops():
    """EOS and stop strings met inside a run of rounds: the tokens after them are dropped."""
    base = SamplingParams(temperature=0, max_tokens=40)
    regular = LLM(**KW)
    plain = _tokens(regular, PROMPTS, base)
    stop_text = regular.tokenizer.decode(plain[0][5:7])
    params = SamplingParams(temperature=0, max_tokens=40, stop=[stop_text])
    ref = regular.generate(PROMPTS, params)
    llm = LLM(speculative={"method": "draft", "fallback": False}, **KW)
    _with_rounds(llm, max_rounds=8, draft_len=4)
    got = llm.generate(PROMPTS, params)
    assert [o.outputs[0].text for o in got] == [o.outputs[0].text for o in ref]
    assert [o.outputs[0].finish_reason for o in got] == [o.outputs[0].finish_reason for o in ref]
    assert got[0].outputs[0].finish_reason == "stop"
    assert llm.engine.scheduler.blocks.num_free_blocks == llm.engine.scheduler.blocks.num_blocks  # nothing held


def test_sampled_requests_take_the_ordinary_step():
    llm = LLM(speculative={"method": "draft", "fallback": False}, **KW)
    r = _with_rounds(llm, max_rounds=4)
    params = SamplingParams(temperature=0.8, seed=1, max_tokens=8)
    ref = _tokens(LLM(speculative={"method": "draft", "fallback": False}, **KW), PROMPTS[:1], params)
    assert _tokens(llm, PROMPTS[:1], params) == ref
    assert r.dev.rounds == 0


def test_rounds_are_a_cuda_graph_option():
    """On by default (16 a sync) where the graph runner runs, off on CPU; a negative count is refused."""
    llm = LLM(**KW)
    assert llm.config.model.cuda_rounds == 16 and llm.engine.rounds is None
    with pytest.raises(ValueError, match="cuda_rounds"):
        LLM(cuda_rounds=-1, **KW)
