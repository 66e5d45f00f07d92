"""Engine vs HF transformers on tiny random-weight models of every supported architecture."""
import pytest
import torch

from specserve import LLM, SamplingParams
from specserve.attention.paged import AttentionMetadata

from .tiny import KINDS, make_tiny

transformers = pytest.importorskip("transformers")


def engine_logits(llm: LLM, ids: list[int]) -> torch.Tensor:
    """All-position logits [T, vocab] of one sequence through the engine's model and paged cache."""
    eng = llm.engine
    block_size = eng.kv.block_size
    table = list(range(-(-len(ids) // block_size)))
    meta = AttentionMetadata.build([len(ids)], [len(ids)], [table], block_size, eng.device)
    return eng.model.forward(torch.tensor(ids), torch.arange(len(ids)), meta, eng.kv.k, eng.kv.v,
                             torch.arange(len(ids)))


@pytest.fixture(scope="module", params=list(KINDS))
def pair(request, tmp_path_factory):
    path = str(tmp_path_factory.mktemp(request.param))
    hf = make_tiny(request.param, path)
    llm = LLM(path, kv_cache_gib=0.01, block_size=4)
    return hf, llm


def test_logits_match_hf(pair):
    hf, llm = pair
    ids = list(torch.randint(0, 256, (37,), generator=torch.Generator().manual_seed(1)).tolist())
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    ours = engine_logits(llm, ids)
    assert (ours - ref).abs().max().item() <= 1e-3


def test_greedy_ragged_batch_matches_hf_generate(pair):
    hf, llm = pair
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 23, 12)]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    for p, o in zip(prompts, outs):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([p]), max_new_tokens=20, do_sample=False, min_new_tokens=20,
                              pad_token_id=0)[0, len(p):].tolist()
        assert o.outputs[0].token_ids == ref
