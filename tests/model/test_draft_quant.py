"""A draft model re-encoded in fewer bits (speculative={"draft_quant": "q4_0"}) reads fewer bytes a pass
and drafts other tokens, but the output stays regular decoding's: every draft token is verified."""
import pytest

from specserve import LLM, SamplingParams

from .test_gguf_tiny import write_gguf
from .tiny import make_tiny

pytest.importorskip("transformers")

PROMPTS = [[5, 6, 7, 8, 5, 6, 9], [40, 3, 9, 1, 2, 3, 4, 5]]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
SEEDED = SamplingParams(temperature=0.8, seed=11, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("draft-quant")
    write_gguf(make_tiny("llama", str(d / "t"), seed=0), d / "target.gguf", quantize=True)  # Q8_0 blocks
    write_gguf(make_tiny("llama", str(d / "d"), seed=0), d / "draft.gguf", quantize=True)
    return str(d / "target.gguf"), str(d / "draft.gguf")


@pytest.mark.parametrize("method", ["draft", "staged"])
def test_a_q4_0_draft_reads_fewer_bytes_and_the_output_stays(pair, method):
    target, draft = pair
    regular = LLM(target, kv_cache_gib=0.01, block_size=4, activations="int8")
    ref = [o.outputs[0].token_ids for o in regular.generate(PROMPTS, GREEDY)]
    ref_seeded = [o.outputs[0].token_ids for o in regular.generate(PROMPTS, SEEDED)]
    sizes = {}
    for quant in ("none", "q4_0"):
        spec = dict(method=method, draft_model=draft, draft_quant=quant, policy="fixed", draft_len=3, fallback=False)
        if method == "staged":
            spec["stages"] = ["draft", "lookup"]
        llm = LLM(target, kv_cache_gib=0.01, block_size=4, activations="int8", speculative=spec)
        d = llm.engine.speculator.drafter
        model = (d.model if method == "staged" else d).model
        assert model.layers[0].qkv.block.type_names == (["Q4_0"] if quant == "q4_0" else ["Q8_0"]) * 3  # q, k, v
        sizes[quant] = model.weight_bytes
        a = model.arch  # every matrix but the embedding: the layers' and the head's
        matrices = a.num_params - a.vocab_size * a.hidden_size - a.hidden_size * (1 + 2 * a.num_hidden_layers)
        assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)] == ref
        assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, SEEDED)] == ref_seeded
        assert llm.spec_stats()["accepted"] > 0
    assert sizes["none"] - sizes["q4_0"] == matrices // 2  # 18 bytes a block of 32 instead of Q8_0's 34 (int8
    # activations run the blocks as stored)


def test_an_eagle_draft_is_not_re_encoded_and_says_so():
    with pytest.raises(ValueError, match="EAGLE draft"):
        LLM(kv_cache_gib=0.01, speculative=dict(method="draft", draft_quant="q4_0"))  # the shipped EAGLE draft
