"""The CUDA-graph runner's static step on CPU (no capture): a padded batch of a decode, a chain to
verify and a token tree gives the eager runner's logits, hidden states and KV, with torch's ops and,
where triton is installed, with the Triton kernels under the interpreter."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from specserve.attention import triton_paged  # noqa: E402
from specserve.engine.graph_runner import GraphModelRunner  # noqa: E402
from specserve.engine.runner import ModelRunner  # noqa: E402
from specserve.kv.cache import KVCache  # noqa: E402
from specserve.loading.weights import ModelArch  # noqa: E402
from specserve.models.llama import LlamaModel  # noqa: E402
from specserve.scheduler.scheduler import ScheduledRequest  # noqa: E402
from specserve.types import Draft, Request, SamplingParams  # noqa: E402

CPU = torch.device("cpu")
ARCH = ModelArch("qwen2", vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
                 max_position_embeddings=64, tie_word_embeddings=True, attention_bias=True)


def _model(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g) * 0.2
    H, Hkv, D, h, f = 4, 2, 16, 64, 96
    w = {"embed": r(97, h), "norm": 1 + r(h)}
    for i in range(2):
        p = f"layers.{i}."
        w.update({p + "attn_norm": 1 + r(h), p + "ffn_norm": 1 + r(h), p + "q": r(H * D, h), p + "k": r(Hkv * D, h),
                  p + "v": r(Hkv * D, h), p + "o": r(h, H * D), p + "gate": r(f, h), p + "up": r(f, h),
                  p + "down": r(h, f), p + "q_bias": r(H * D), p + "k_bias": r(Hkv * D), p + "v_bias": r(Hkv * D)})
    return LlamaModel(ARCH, w, dtype, CPU, use_blocks=False)


def _prefilled(model, dtype=torch.float32):
    """Three requests with their prompts (and first output token) computed by the eager runner."""
    kv = KVCache(2, 12, 4, 2, 16, dtype, CPU)
    eager = ModelRunner(model, kv, CPU, attention="pad")
    a = Request("a", [1, 2, 3, 4, 5, 6], SamplingParams())
    b = Request("b", [7, 8, 9, 10, 11], SamplingParams())
    c = Request("c", [12, 13, 14, 15], SamplingParams())
    a.block_table, b.block_table, c.block_table = [0, 1], [2, 3, 4], [5, 6]
    eager.execute([ScheduledRequest(r, 0, len(r.prompt_token_ids)) for r in (a, b, c)])
    a.output_token_ids, b.output_token_ids, c.output_token_ids = [20], [21], [22]
    chain = Draft([30, 31, 32])  # a chain to verify
    tree = Draft([40, 41, 42], parents=[-1, -1, 0])  # a tree hanging from 22
    step = [ScheduledRequest(a, 6, 1), ScheduledRequest(b, 5, 4, chain), ScheduledRequest(c, 4, 4, tree)]
    return kv, step


@pytest.mark.parametrize("fused", ["torch", "triton", "triton-invariant"])
def test_static_step_matches_the_eager_runner(fused):
    """(triton-invariant: the projections and LM head by cuda/linear.py's fixed tiling too.)"""
    if fused != "torch" and not triton_paged.available():
        pytest.skip("triton not installed (pip install '.[gpu-test]')")
    model = _model()
    kv, step = _prefilled(model)
    kv_static = KVCache(2, 12, 4, 2, 16, torch.float32, CPU)
    kv_static.k.copy_(kv.k)
    kv_static.v.copy_(kv.v)
    ref = ModelRunner(model, kv, CPU, attention="pad").execute(step, return_hidden=True)
    runner = GraphModelRunner(model, kv_static, CPU, "pad", max_seqs=4, max_model_len=64, max_graph_tokens=16,
                              use_triton=fused != "torch", invariant=fused == "triton-invariant")
    out = runner.execute(step, return_hidden=True)
    assert runner.counts["graph"] == 1  # 9 tokens, padded to the captured 12
    assert [r.logits for r in out.rows] == [r.logits for r in ref.rows]
    torch.testing.assert_close(out.logits, ref.logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.hidden, ref.hidden, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(kv_static.k, kv.k, rtol=1e-5, atol=1e-5)  # the same slots written, no others
    torch.testing.assert_close(kv_static.v, kv.v, rtol=1e-5, atol=1e-5)


def test_prompt_chunks_run_eagerly():
    model = _model()
    kv = KVCache(2, 12, 4, 2, 16, torch.float32, CPU)
    runner = GraphModelRunner(model, kv, CPU, "pad", max_seqs=4, max_model_len=64, max_graph_tokens=16,
                              use_triton=False)
    r = Request("a", list(range(1, 20)), SamplingParams())
    r.block_table = [0, 1, 2, 3, 4]
    runner.execute([ScheduledRequest(r, 0, 19)])  # 19 > MAX_GRAPH_Q: a prompt chunk
    assert runner.counts == {"eager": 1}


def test_bf16_static_step_stays_close_to_eager():
    """bf16 weights and KV (the CUDA default): the fused ops round where the torch ones do."""
    model = _model(torch.bfloat16)
    kv, step = _prefilled(model, torch.bfloat16)
    kv_static = KVCache(2, 12, 4, 2, 16, torch.bfloat16, CPU)
    kv_static.k.copy_(kv.k)
    kv_static.v.copy_(kv.v)
    ref = ModelRunner(model, kv, CPU, attention="pad").execute(step)
    out = GraphModelRunner(model, kv_static, CPU, "pad", max_seqs=4, max_model_len=64, max_graph_tokens=16,
                           use_triton=False).execute(step)
    # bf16 rounding apart (fp32 softmax and rope here, bf16 steps in SDPA): a few hundredths of a logit
    assert (out.logits - ref.logits).abs().max() < 0.25
    assert torch.equal(out.logits.argmax(-1), ref.logits.argmax(-1))


@pytest.mark.skipif(not triton_paged.available(), reason="triton not installed (pip install '.[gpu-test]')")
def test_prompt_chunks_run_the_fused_kernels_without_a_graph():
    """Past the graphs (a prompt chunk, a mixed step) the fused kernels run eagerly over the buffers,
    the LM head only over the rows that sample; the KV and logits are the eager runner's."""
    model = _model()
    kv, kv_fused = (KVCache(2, 12, 4, 2, 16, torch.float32, CPU) for _ in range(2))
    a = Request("a", list(range(1, 20)), SamplingParams())
    b = Request("b", [5, 6, 7], SamplingParams())
    b.output_token_ids = [9]
    a.block_table, b.block_table = [0, 1, 2, 3, 4], [5, 6]
    for cache in (kv, kv_fused):  # b's prompt first, so the mixed step below has a decode in it
        ModelRunner(model, cache, CPU, attention="pad").execute([ScheduledRequest(b, 0, 3)])
    step = [ScheduledRequest(b, 3, 1), ScheduledRequest(a, 0, 12, samples=False)]
    ref = ModelRunner(model, kv, CPU, attention="pad").execute(step)
    runner = GraphModelRunner(model, kv_fused, CPU, "pad", max_seqs=4, max_model_len=64, max_graph_tokens=8,
                              max_step_tokens=32, use_triton=True)
    out = runner.execute(step)
    assert runner.counts == {"fused": 1}
    assert out.logits.shape[0] == 1  # b's row only: a's chunk is short of its prompt's end
    torch.testing.assert_close(out.logits, ref.logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(kv_fused.k, kv.k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kv_fused.v, kv.v, rtol=1e-5, atol=1e-5)


def test_time_pass_times_a_verify_span_on_the_path_serving_takes():
    """The cost model's calibration through the graph runner (spec.calibration.calibrate's time_fn)."""
    from specserve.kv.block_manager import BlockManager
    from specserve.speculative.calibration import calibrate
    from specserve.speculative.cost_model import CostModel
    model = _model()
    kv = KVCache(2, 12, 4, 2, 16, torch.float32, CPU)
    runner = GraphModelRunner(model, kv, CPU, "pad", max_seqs=4, max_model_len=64, max_graph_tokens=8,
                              use_triton=False)
    assert runner.time_pass([0, 1, 2, 3], 5, 8) > 0
    assert runner.counts == {"graph": 1}  # 1 + 4 draft rows: a verify span, padded to the graph of 6
    costs = CostModel()
    calibrate(costs, model, kv, BlockManager(12, 4), "pad", "pad", 16, context=8, rows=(1, 2, 4, 8, 16),
              time_fn=runner.time_pass)
    assert sorted(costs.calibrated) == [1, 2, 4, 8, 16]
    assert runner.counts["eager"] == 3  # 16 rows, past the graphs: eager (no triton), the best of three


def test_a_timed_prompt_pass_takes_the_path_a_prompt_chunk_takes():
    """What measure_prefill_chunk times on CUDA: a prompt of up to 16 tokens replays a graph, a longer one
    runs past the graphs (the fused kernels, or here without triton the model's own forward)."""
    model = _model()
    kv = KVCache(2, 12, 4, 2, 16, torch.float32, CPU)
    runner = GraphModelRunner(model, kv, CPU, "pad", max_seqs=4, max_model_len=64, max_graph_tokens=16,
                              use_triton=False)
    table = list(range(8))
    assert runner.time_pass(table, 12, 0, repeats=2, prompt=True) > 0
    assert runner.counts == {"graph": 2}
    runner.time_pass(table, 20, 0, prompt=True)
    assert runner.counts == {"graph": 2, "eager": 1}
