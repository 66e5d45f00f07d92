"""The CUDA-graph runner inside the whole engine, on CPU (static steps run their kernels without
capture): the embedded model's greedy output is the eager engine's, for regular decoding and for
EAGLE speculation with chains and token trees (verify spans of the static step's buffers), at batch 1
and 3. With triton installed the fused Triton kernels run too, under the interpreter."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from specserve import LLM, SamplingParams  # noqa: E402
from specserve.attention import triton_paged  # noqa: E402
from specserve.engine.graph_runner import GraphModelRunner  # noqa: E402

PROMPTS = ["def fibonacci(n):", "The capital of France is", "import numpy as np\n"]


def _graphed(llm: LLM, use_triton: bool) -> GraphModelRunner:
    """Swap the engine's runner for the graph runner (what LLMEngine does on CUDA)."""
    eager = llm.engine.runner
    runner = GraphModelRunner(eager.model, eager.kv, eager.device, eager.attention, eager.plain_attention,
                              max_seqs=4, max_model_len=512, max_graph_tokens=24, max_step_tokens=256,
                              use_triton=use_triton)
    llm.engine.runner = runner
    return runner


@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_graph_runner_keeps_greedy_output(shape):
    params = SamplingParams(temperature=0, max_tokens=12)
    # dense fp32 (the static step takes dense projections), no prefix caching (both engines alike)
    kw = dict(block_kernels=False, max_model_len=512, prefill_chunk=None, enable_prefix_caching=False, kv_cache_gib=0.05)
    ref = [o.outputs[0].token_ids for o in LLM(**kw).generate(PROMPTS, params)]
    spec = LLM(speculative={"method": "draft", "shape": shape, "fallback": False}, **kw)
    runner = _graphed(spec, use_triton=False)
    got = [o.outputs[0].token_ids for o in spec.generate(PROMPTS, params)]
    assert got == ref
    got1 = spec.generate(PROMPTS[:1], params)[0].outputs[0].token_ids
    assert got1 == ref[0]
    assert runner.counts["graph"] > 0  # the verify steps went through the static step


@pytest.mark.skipif(not triton_paged.available(), reason="triton not installed (pip install '.[gpu-test]')")
def test_fused_kernels_keep_greedy_output_under_the_interpreter():
    params = SamplingParams(temperature=0, max_tokens=6)
    kw = dict(block_kernels=False, max_model_len=512, prefill_chunk=None, enable_prefix_caching=False, kv_cache_gib=0.05)
    llm = LLM(**kw)
    prompts = [PROMPTS[0], "def is_prime(n: int) -> bool:\n    \"\"\"Return True if n is a prime number.\"\"\"\n"]
    ref = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    runner = _graphed(llm, use_triton=True)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert got == ref
    assert runner.counts["graph"] > 0 and runner.counts["fused"] > 0  # the long prompt: fused, no graph


@pytest.mark.parametrize("fused", ["torch", "triton"])
@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_graphed_eagle_drafts_what_the_eager_drafter_drafts(fused, shape):
    """EAGLE through cuda.eagle_graph (greedy chains: its graph bodies, uncaptured; every other draft
    pass, the catch-up and a tree's levels: forward_rows; torch ops, or the Triton kernels under the
    interpreter): the same drafts as the drafter's eager passes, so the same acceptance and output."""
    from specserve.cuda.eagle_graph import EagleChainGraphs
    if fused == "triton" and not triton_paged.available():
        pytest.skip("triton not installed (pip install '.[gpu-test]')")

    params = SamplingParams(temperature=0, max_tokens=16)
    kw = dict(block_kernels=False, max_model_len=512, prefill_chunk=None, enable_prefix_caching=False,
              kv_cache_gib=0.05, speculative={"method": "draft", "shape": shape, "fallback": False})
    eager = LLM(**kw)
    ref = [o.outputs[0].token_ids for o in eager.generate(PROMPTS, params)]
    graphed = LLM(**kw)
    drafter = graphed.engine.speculator.drafter
    drafter.chain_graphs = EagleChainGraphs(drafter, 4, 512, capture=False, use_triton=fused == "triton")
    got = [o.outputs[0].token_ids for o in graphed.generate(PROMPTS, params)]
    assert got == ref
    g = drafter.chain_graphs
    # the catch-ups (these prompts' too: under 64 rows) and a tree's levels took the padded graph path
    assert g.rows_graphed == g.rows_passes > 0 and (g.counts > 0) == (shape == "chain")
    a, b = eager.spec_stats(), graphed.spec_stats()
    assert (a["drafted"], a["accepted"]) == (b["drafted"], b["accepted"])


@pytest.mark.parametrize("method,shape,draft_seed", [("draft", "chain", 0), ("draft", "tree", 1),
                                                     ("lookup+draft", "chain", 1), ("staged", "chain", 0)])
def test_graphed_draft_model_drafts_what_the_eager_drafter_drafts(tmp_path, method, shape, draft_seed):
    """A standalone draft model's passes through cuda.draft_graph (each at its padded size, uncaptured,
    the fused ops' torch references), attached the way the engine attaches them on CUDA (alone, the model
    side of "lookup+draft", a staged level): the same drafts as its eager passes, so the same acceptance
    and output. A draft with the target's weights (seed 0) drafts what the target decodes, so a pass
    that read or wrote the wrong KV rows would show as rejections; seed 1 drafts are mostly rejected
    (the catch-up after a rejection, trees' levels)."""
    pytest.importorskip("transformers")
    from specserve.engine.llm_engine import _graph_drafter
    from tests.model.spec_checks import GREEDY, PROMPTS
    from tests.model.tiny import make_tiny

    target, draft = str(tmp_path / "target"), str(tmp_path / "draft")
    make_tiny("llama", target, seed=0)
    make_tiny("llama", draft, seed=draft_seed)
    spec = dict(method=method, draft_model=draft, policy="fixed", draft_len=3, fallback=False, shape=shape,
                tree_top_k=2, tree_beam=2, tree_max_nodes=6)
    if method == "staged":
        spec["stages"] = ["draft", "lookup"]
    kw = dict(block_kernels=False, kv_cache_gib=0.01, block_size=4, prefill_chunk=None, speculative=spec)
    eager = LLM(target, **kw)
    ref = [o.outputs[0].token_ids for o in eager.generate(PROMPTS, GREEDY)]
    graphed = LLM(target, **kw)
    top = graphed.engine.speculator.drafter
    _graph_drafter(top, graphed.engine.config, graphed.engine.max_model_len)
    drafter = top if method == "draft" else top.model
    assert drafter.graphs is not None and not drafter.graphs.capture
    got = [o.outputs[0].token_ids for o in graphed.generate(PROMPTS, GREEDY)]
    assert got == ref
    a, b = eager.spec_stats(), graphed.spec_stats()
    assert (a["drafted"], a["accepted"]) == (b["drafted"], b["accepted"]) and a["drafted"] > 0
    if draft_seed == 0:
        assert b["accepted"] > 0.9 * b["drafted"]
    assert drafter.graphs.passes > 0 and (drafter.graphs.tree_passes > 0) == (shape == "tree")


@pytest.mark.parametrize("fused", ["torch", "triton"])
def test_graphed_draft_pass_gives_the_reduced_heads_logits(tmp_path, fused):
    """A draft with a cut vocabulary (LlamaModel.head_rows): a graphed pass's logits are those of the
    eager pass, over the same V' rows, for a two-request prompt pass and one- and two-row steps (the
    fused ops' torch references, or the Triton kernels under the interpreter)."""
    pytest.importorskip("transformers")
    if fused == "triton" and not triton_paged.available():
        pytest.skip("triton not installed (pip install '.[gpu-test]')")
    from specserve.cuda.draft_graph import DraftModelGraphs
    from specserve.drafters.draft_model import DraftModelDrafter
    from specserve.types import Request
    from tests.model.tiny import make_tiny

    make_tiny("llama", str(tmp_path), seed=0)
    model = LLM(str(tmp_path), block_kernels=False, kv_cache_gib=0.01).engine.model
    vocab_ids = torch.arange(1, model.arch.vocab_size, 3)
    eager, graphed = (DraftModelDrafter(model, 16, 4, vocab_ids=vocab_ids) for _ in range(2))
    graphed.graphs = DraftModelGraphs(model, graphed.kv, 4, 64, len(vocab_ids), head=graphed.head_rows, capture=False,
                                      use_triton=fused == "triton")
    reqs = [Request("a", [5, 6, 7, 8, 5], SamplingParams(temperature=0)), Request("b", [9, 3], SamplingParams(temperature=0))]
    for d in (eager, graphed):
        for r in reqs:
            assert d.reserve(r, 12)
    for spans, starts in [([[5, 6, 7, 8, 5], [9, 3]], [0, 0]), ([[11], [12]], [5, 2]), ([[13, 14], [15]], [6, 3])]:
        want = eager.score(reqs, spans, starts)
        got = graphed.score(reqs, spans, starts)
        assert got.shape == want.shape == (2, len(vocab_ids))
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert graphed.graphs.passes == 3
