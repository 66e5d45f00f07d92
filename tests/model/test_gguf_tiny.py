"""The GGUF path on tiny models written here with the gguf package: llama.cpp's q/k row permutation,
llama3 rope factors (rope_freqs), tied embeddings, and Q8_0 blocks through the block kernels."""
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter, quants
from tokenizers import pre_tokenizers

from specserve import LLM, SamplingParams
from specserve.models.layers import rope_inv_freq

from .test_parity_tiny import engine_logits
from .tiny import make_tiny

transformers = pytest.importorskip("transformers")


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf does to q/k rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(hf, path, quantize: bool):
    c = hf.config
    w = GGUFWriter(str(path), "llama")
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(sorted(pre_tokenizers.ByteLevel.alphabet()))
    w.add_token_merges([])
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in hf.state_dict().items()}
    names = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
             "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
             "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
             "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
             "mlp.down_proj.weight": "ffn_down.weight"}
    dequantized = {}

    def add(name, hf_name, arr, n_head=None):
        stored = permute(arr, n_head) if n_head else arr
        if quantize and arr.ndim == 2:
            # Q8_0 blocks run along rows, so quantising commutes with the row permutation.
            w.add_tensor(name, quants.quantize(stored, GGMLQuantizationType.Q8_0), raw_dtype=GGMLQuantizationType.Q8_0)
            dequantized[hf_name] = quants.dequantize(quants.quantize(arr, GGMLQuantizationType.Q8_0),
                                                     GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, stored)

    add("token_embd.weight", "model.embed_tokens.weight", sd["model.embed_tokens.weight"])
    add("output_norm.weight", "model.norm.weight", sd["model.norm.weight"])
    if not c.tie_word_embeddings:
        add("output.weight", "lm_head.weight", sd["lm_head.weight"])
    for i in range(c.num_hidden_layers):
        for hf_suffix, g in names.items():
            n_head = {"attn_q.weight": c.num_attention_heads, "attn_k.weight": c.num_key_value_heads}.get(g)
            add(f"blk.{i}.{g}", f"model.layers.{i}.{hf_suffix}", sd[f"model.layers.{i}.{hf_suffix}"], n_head)
    rope = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None)
    if rope and rope.get("rope_type") == "llama3":
        head_dim = c.hidden_size // c.num_attention_heads
        base = rope_inv_freq(head_dim, 10000.0, None)
        w.add_tensor("rope_freqs.weight", (base / rope_inv_freq(head_dim, 10000.0, rope)).numpy().astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dequantized


@pytest.mark.parametrize("kind,quantize", [("llama3-rope", False), ("llama-mqa-tied", True), ("llama", True)])
def test_gguf_logits_match_hf(kind, quantize, tmp_path):
    hf = make_tiny(kind, str(tmp_path / "hf"))
    dequantized = write_gguf(hf, tmp_path / "m.gguf", quantize)
    if dequantized:  # the reference model carries exactly the weights the blocks hold
        with torch.no_grad():
            for name, arr in dequantized.items():
                hf.state_dict()[name].copy_(torch.from_numpy(np.ascontiguousarray(arr).reshape(hf.state_dict()[name].shape)))
    llm = LLM(str(tmp_path / "m.gguf"), kv_cache_gib=0.01, block_size=4)
    if quantize:  # the decode-sized steps below run through the blocks
        assert llm.engine.model.layers[0].qkv.block is not None and llm.engine.model.lm_head.block is not None
    ids = list(range(5, 45))
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    assert (engine_logits(llm, ids) - ref).abs().max().item() <= 1e-3  # one prefill (dense copies)
    out = llm.generate([ids[:8]], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))[0]
    with torch.no_grad():  # one token a step (block kernels, fused layers)
        expect = hf.generate(torch.tensor([ids[:8]]), max_new_tokens=16, min_new_tokens=16, do_sample=False,
                             pad_token_id=0)[0, 8:].tolist()
    assert out.outputs[0].token_ids == expect
