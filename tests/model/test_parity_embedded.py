"""The embedded SmolLM2-135M (Q4_1 GGUF) against HF transformers loading the same GGUF in float32."""
import importlib.util
import os

import pytest
import torch

from specserve import SamplingParams
from specserve.attention.paged import AttentionMetadata
from specserve.loading import embedded_model_path
from specserve_bench.humaneval import humaneval_prompts

transformers = pytest.importorskip("transformers")
if importlib.util.find_spec("accelerate") is None:
    pytest.skip("HF's GGUF loader needs accelerate", allow_module_level=True)


@pytest.fixture(scope="module")
def hf_model():
    path = embedded_model_path()
    return transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32).eval()


def stepwise_logits(llm, ids, n_decode):
    """Logits at every position: the first len-n_decode tokens as one prefill (dense path), then one
    token per step (the block-kernel path), all through the paged cache."""
    eng = llm.engine
    bs = eng.kv.block_size
    table: list[int] = []  # blocks of its own (others may hold the prefix cache's KV)
    eng.scheduler.blocks.allocate(table, len(ids))
    out, start = [], 0
    try:
        for n in [len(ids) - n_decode] + [1] * n_decode:
            meta = AttentionMetadata.build([n], [start + n], [table], bs, eng.device)
            out.append(eng.model.forward(torch.tensor(ids[start:start + n]), torch.arange(start, start + n), meta,
                                         eng.kv.k, eng.kv.v, torch.arange(n)))
            start += n
    finally:
        eng.scheduler.blocks.free(table)
    return torch.cat(out)


def test_logits_match_hf(embedded_llm, hf_model):
    for prompt in humaneval_prompts(3):
        ids = embedded_llm.tokenizer.encode(prompt)
        ours = stepwise_logits(embedded_llm, ids, n_decode=6)
        with torch.no_grad():
            ref = hf_model(torch.tensor([ids])).logits[0]
        assert (ours - ref).abs().max().item() <= 1e-3


def test_greedy_matches_hf_generate(embedded_llm, hf_model):
    prompts = humaneval_prompts(4)
    outs = embedded_llm.generate(prompts, SamplingParams(temperature=0, max_tokens=48))
    for prompt, out in zip(prompts, outs):
        ids = embedded_llm.tokenizer.encode(prompt)
        with torch.no_grad():
            ref = hf_model.generate(torch.tensor([ids]), max_new_tokens=48, do_sample=False)[0, len(ids):].tolist()
        assert out.outputs[0].token_ids == ref
