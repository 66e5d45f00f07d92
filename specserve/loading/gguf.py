"""GGUF files -> (ModelArch, canonical weights, Tokenizer).

The header is read by gguf_file.GGUFFile; quantized matrices stay in their blocks as views of the
mmap'd file (QuantizedWeight.raw), which the block kernels read in place: a model costs its file's
bytes, and the OS pages them in and shares them between processes. Every tensor's shape is checked
against the architecture before anything is built from it."""
from __future__ import annotations

import re

import numpy as np
import torch

from ..registry import ARCHITECTURES
from .gguf_file import GGUFFile
from .quants import dequantize
from .tokenizer import Tokenizer
from .validate import check_gguf_fields
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
    # Gemma 3
    "attn_q_norm.weight": "q_norm",
    "attn_k_norm.weight": "k_norm",
    "post_attention_norm.weight": "post_attn_norm",
    "post_ffw_norm.weight": "post_ffn_norm",
}
_GLOBAL_NAMES = {"token_embd.weight": "embed", "output_norm.weight": "norm", "output.weight": "lm_head",
                 "rope_freqs.weight": "rope_freqs"}
# Kept as GGML blocks (the block kernels read them); everything else is dequantised at load.
_KEEP_QUANTIZED = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q6_K")


def _arch_from_fields(f: dict, path: str, tensor_names: set) -> ModelArch:
    arch = f.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(f"{path}: architecture {arch!r} is not supported (supported: {', '.join(ARCHITECTURES.names())})")
    p = arch + "."
    missing = [k for k in ("attention.head_count", "embedding_length", "feed_forward_length", "block_count")
               if p + k not in f]
    if missing:
        raise ValueError(f"{path}: the header lacks {', '.join(p + k for k in missing)}")
    n_heads = int(f[p + "attention.head_count"])
    hidden = int(f[p + "embedding_length"])
    vocab = int(f.get(p + "vocab_size") or len(f["tokenizer.ggml.tokens"]))
    eos = [f["tokenizer.ggml.eos_token_id"]] if "tokenizer.ggml.eos_token_id" in f else []
    if "tokenizer.ggml.eot_token_id" in f and f["tokenizer.ggml.eot_token_id"] not in eos:
        eos.append(f["tokenizer.ggml.eot_token_id"])
    entry = ARCHITECTURES.get(arch)
    window = f.get(p + "attention.sliding_window")
    scaling = None
    if f.get(p + "rope.scaling.type") == "linear" and float(f.get(p + "rope.scaling.factor", 1.0)) != 1.0:
        scaling = {"rope_type": "linear", "factor": float(f[p + "rope.scaling.factor"])}
    elif f.get(p + "rope.scaling.type") not in (None, "none", "linear"):
        raise ValueError(f"{path}: RoPE scaling {f[p + 'rope.scaling.type']!r} is not supported (supported: linear)")
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
        rope_scaling=scaling,
        sliding_window=int(window) if window else None,
        global_every=entry.global_every if window else 0,
        rope_local_theta=entry.rope_local_theta,
        bos_token_id=f.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=eos,
    )


def _unpermute_order(rows: int, n_heads: int) -> np.ndarray:
    """llama.cpp's converter interleaves the two rotary halves of each head's q/k rows (GPT-J order);
    this row order undoes it, giving the Hugging Face (NeoX, rotate-half) layout."""
    half = rows // n_heads // 2
    return np.arange(rows).reshape(n_heads, half, 2).swapaxes(1, 2).reshape(-1)


def expected_shapes(arch: ModelArch) -> dict[str, tuple[int, ...]]:
    """Canonical name -> the shape the architecture implies (numpy order: [out, in] for a matrix)."""
    h, f, d = arch.hidden_size, arch.intermediate_size, arch.head_dim
    q, kv = arch.num_attention_heads * d, arch.num_key_value_heads * d
    shapes = {"embed": (arch.vocab_size, h), "norm": (h,), "lm_head": (arch.vocab_size, h)}
    per_layer = {"attn_norm": (h,), "ffn_norm": (h,), "q": (q, h), "k": (kv, h), "v": (kv, h), "o": (h, q),
                 "q_bias": (q,), "k_bias": (kv,), "v_bias": (kv,), "gate": (f, h), "up": (f, h), "down": (h, f),
                 "q_norm": (d,), "k_norm": (d,), "post_attn_norm": (h,), "post_ffn_norm": (h,)}
    for i in range(arch.num_hidden_layers):
        shapes.update({f"layers.{i}.{k}": v for k, v in per_layer.items()})
    return shapes


def required_names(arch: ModelArch) -> list[str]:
    names = ["embed", "norm"] + ([] if arch.tie_word_embeddings else ["lm_head"])
    per_layer = ["attn_norm", "ffn_norm", "q", "k", "v", "o", "gate", "up", "down"]
    per_layer += ["q_bias", "k_bias", "v_bias"] if arch.attention_bias else []
    per_layer += list(ARCHITECTURES.get(arch.architecture).extra_layer_weights)
    return names + [f"layers.{i}.{k}" for i in range(arch.num_hidden_layers) for k in per_layer]


def _canonical(tensor_name: str) -> str | None:
    m = re.fullmatch(r"blk\.(\d+)\.(.+)", tensor_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
    return _GLOBAL_NAMES.get(tensor_name)


def load_gguf(path: str, keep_quantized: bool = True):
    """Returns (arch, weights: {canonical name: Tensor | QuantizedWeight}, tokenizer)."""
    g = GGUFFile(path)
    check_gguf_fields(g.fields, path, len(g.tensors))
    arch = _arch_from_fields(g.fields, path, set(g.tensors))
    tokenizer = Tokenizer.from_gguf_fields(g.fields, path)
    expected = expected_shapes(arch)
    by_name = {c: t for t in g.tensors.values() if (c := _canonical(t.name)) is not None}
    missing = [n for n in required_names(arch) if n not in by_name]
    if missing:
        raise ValueError(f"{path}: tensors missing for a {arch.num_hidden_layers}-layer {arch.architecture} model "
                         f"(e.g. {', '.join(missing[:3])}): block_count or the file is wrong")
    permuted = ARCHITECTURES.get(arch.architecture).gguf_permuted_qk
    weights = {}
    for name, t in by_name.items():
        want = expected.get(name)
        if want is not None and t.shape != want:
            raise ValueError(f"{path}: tensor {t.name} has shape {list(t.shape)}, the header's hyper-parameters "
                             f"imply {list(want)}")
        if len(t.shape) == 2 and keep_quantized and t.type_name in _KEEP_QUANTIZED:
            w = QuantizedWeight(t.type_name, g.raw(t.name), t.shape)
        else:
            w = torch.from_numpy(np.array(dequantize(g.raw(t.name), t.type_name, t.shape), copy=True))
        if permuted and name.endswith((".q", ".k", ".q_bias", ".k_bias")):
            n = arch.num_attention_heads if name.endswith(("q", "q_bias")) else arch.num_key_value_heads
            order = _unpermute_order(t.shape[0], n)
            w = w.permute_rows(order) if isinstance(w, QuantizedWeight) else w[torch.from_numpy(order)]
        weights[name] = w
    return arch, weights, tokenizer
