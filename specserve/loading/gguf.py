"""GGUF files -> (ModelArch, canonical weights, Tokenizer), through the `gguf` package's reader."""
from __future__ import annotations

import re

import numpy as np
import torch

from ..registry import ARCHITECTURES
from .quants import SUPPORTED_TYPES, dequantize
from .tokenizer import Tokenizer
from .weights import ModelArch, QuantizedWeight

_LAYER_NAMES = {
    "attn_norm.weight": "attn_norm",
    "ffn_norm.weight": "ffn_norm",
    "attn_q.weight": "q",
    "attn_k.weight": "k",
    "attn_v.weight": "v",
    "attn_output.weight": "o",
    "attn_q.bias": "q_bias",
    "attn_k.bias": "k_bias",
    "attn_v.bias": "v_bias",
    "ffn_gate.weight": "gate",
    "ffn_up.weight": "up",
    "ffn_down.weight": "down",
}
_GLOBAL_NAMES = {"token_embd.weight": "embed", "output_norm.weight": "norm", "output.weight": "lm_head",
                 "rope_freqs.weight": "rope_freqs"}
# Kept as GGML blocks (the block kernels read them); everything else is dequantised at load.
_KEEP_QUANTIZED = ("Q8_0", "Q4_0", "Q4_1")


def read_fields(reader) -> dict:
    out = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        try:
            out[name] = field.contents()
        except Exception:  # a field type this gguf version cannot decode: not one we need
            continue
    return out


def _arch_from_fields(f: dict, path: str, tensor_names: set) -> ModelArch:
    arch = f.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"{path}: architecture {arch!r} is not supported (supported: {', '.join(ARCHITECTURES.names())})")
    p = arch + "."
    n_heads = int(f[p + "attention.head_count"])
    hidden = int(f[p + "embedding_length"])
    vocab = int(f.get(p + "vocab_size") or len(f["tokenizer.ggml.tokens"]))
    eos = [f["tokenizer.ggml.eos_token_id"]] if "tokenizer.ggml.eos_token_id" in f else []
    if "tokenizer.ggml.eot_token_id" in f and f["tokenizer.ggml.eot_token_id"] not in eos:
        eos.append(f["tokenizer.ggml.eot_token_id"])
    return ModelArch(
        architecture=arch,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(f[p + "feed_forward_length"]),
        num_hidden_layers=int(f[p + "block_count"]),
        num_attention_heads=n_heads,
        num_key_value_heads=int(f.get(p + "attention.head_count_kv", n_heads)),
        head_dim=int(f.get(p + "attention.key_length", hidden // n_heads)),
        rms_norm_eps=float(f.get(p + "attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(f.get(p + "rope.freq_base", 10000.0)),
        max_position_embeddings=int(f.get(p + "context_length", 4096)),
        tie_word_embeddings="output.weight" not in tensor_names,
        attention_bias="blk.0.attn_q.bias" in tensor_names,
        bos_token_id=f.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=eos,
    )


def _unpermute_order(rows: int, n_heads: int) -> np.ndarray:
    """llama.cpp's converter interleaves the two rotary halves of each head's q/k rows (GPT-J order);
    this row order undoes it, giving the Hugging Face (NeoX, rotate-half) layout."""
    half = rows // n_heads // 2
    return np.arange(rows).reshape(n_heads, half, 2).swapaxes(1, 2).reshape(-1)


def load_gguf(path: str, keep_quantized: bool = True):
    """Returns (arch, weights: {canonical name: Tensor | QuantizedWeight}, tokenizer)."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path)
    except Exception as e:
        raise ValueError(f"{path}: not a readable GGUF file ({e})") from None
    fields = read_fields(reader)
    names = {t.name for t in reader.tensors}
    arch = _arch_from_fields(fields, path, names)
    tokenizer = Tokenizer.from_gguf_fields(fields, path)

    weights = {}
    layer_re = re.compile(r"blk\.(\d+)\.(.+)")
    for t in reader.tensors:
        m = layer_re.fullmatch(t.name)
        if m and m.group(2) in _LAYER_NAMES:
            name = f"layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
        elif t.name in _GLOBAL_NAMES:
            name = _GLOBAL_NAMES[t.name]
        else:
            continue
        type_name = t.tensor_type.name
        if type_name not in SUPPORTED_TYPES:
            raise ValueError(f"{path}: tensor {t.name} has quantization type {type_name}, "
                             f"not supported (supported: {', '.join(SUPPORTED_TYPES)})")
        shape = tuple(int(s) for s in reversed(t.shape))  # GGUF lists the fastest dimension first
        if len(shape) == 2 and keep_quantized and type_name in _KEEP_QUANTIZED:
            w = QuantizedWeight(type_name, np.asarray(t.data).reshape(shape[0], -1), shape)
        else:
            w = torch.from_numpy(np.array(dequantize(t.data, type_name, shape), copy=True))
        if ARCHITECTURES.get(arch.architecture).gguf_permuted_qk and name.endswith((".q", ".k", ".q_bias", ".k_bias")):
            n = arch.num_attention_heads if name.endswith(("q", "q_bias")) else arch.num_key_value_heads
            order = _unpermute_order(shape[0], n)
            w = w.permute_rows(order) if isinstance(w, QuantizedWeight) else w[torch.from_numpy(order)]
        weights[name] = w
    return arch, weights, tokenizer
