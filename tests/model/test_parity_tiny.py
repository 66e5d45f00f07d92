"""Engine vs HF transformers on tiny random-weight models of every supported architecture.

SPECSERVE_TEST_DEVICE=cuda runs the same checks on a GPU (the code path is the same)."""
import copy
import os

import pytest
import torch

from specserve import LLM, SamplingParams
from specserve.attention.paged import AttentionMetadata

from .tiny import KINDS, make_tiny

transformers = pytest.importorskip("transformers")
DEVICE = os.environ.get("SPECSERVE_TEST_DEVICE", "cpu")


def engine_logits(llm: LLM, ids: list[int]) -> torch.Tensor:
    """All-position logits [T, vocab] of one sequence through the engine's model and paged cache."""
    eng = llm.engine
    block_size = eng.kv.block_size
    table: list[int] = []  # blocks of its own (others may hold the prefix cache's KV)
    eng.scheduler.blocks.allocate(table, len(ids))
    try:
        meta = AttentionMetadata.build([len(ids)], [len(ids)], [table], block_size, eng.device)
        dev = eng.device
        return eng.model.forward(torch.tensor(ids, device=dev), torch.arange(len(ids), device=dev), meta, eng.kv.k,
                                 eng.kv.v, torch.arange(len(ids), device=dev))
    finally:
        eng.scheduler.blocks.free(table)


@pytest.fixture(scope="module", params=list(KINDS))
def pair(request, tmp_path_factory):
    path = str(tmp_path_factory.mktemp(request.param))
    hf = make_tiny(request.param, path).to(DEVICE)
    llm = LLM(path, kv_cache_gib=0.01, block_size=4, device=DEVICE)
    return hf, llm


def test_logits_match_hf(pair):
    hf, llm = pair
    ids = list(torch.randint(0, 256, (37,), generator=torch.Generator().manual_seed(1)).tolist())
    with torch.no_grad():
        ref = hf(torch.tensor([ids], device=DEVICE)).logits[0]
    ours = engine_logits(llm, ids)
    assert (ours - ref).abs().max().item() <= 1e-3


@pytest.mark.parametrize("dtype", ["bfloat16"] + (["float16"] if DEVICE.startswith("cuda") else []))
def test_half_precision_logits_close_to_fp32(pair, dtype):
    hf, llm32 = pair
    llm = LLM(llm32.engine.model_path, kv_cache_gib=0.01, block_size=4, device=DEVICE, dtype=dtype)
    ids = list(range(3, 40))
    ref = engine_logits(llm32, ids)
    ours = engine_logits(llm, ids)
    # Half precision is judged against HF transformers' own error in the same dtype: a correct path
    # lands near it, a wrong one (a missed cast, a norm in bf16) far above.
    hf_half = copy.deepcopy(hf).to(getattr(torch, dtype))
    with torch.no_grad():
        hf_half_logits = hf_half(torch.tensor([ids], device=DEVICE)).logits[0].float()
    rel = lambda a: ((a.float() - ref).norm() / ref.norm()).item()
    assert rel(ours) <= 2 * rel(hf_half_logits) + 1e-3


def test_greedy_ragged_batch_matches_hf_generate(pair):
    hf, llm = pair
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 23, 12)]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    for p, o in zip(prompts, outs):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([p], device=DEVICE), max_new_tokens=20, do_sample=False, min_new_tokens=20,
                              pad_token_id=0)[0, len(p):].tolist()
        assert o.outputs[0].token_ids == ref
