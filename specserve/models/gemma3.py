"""Gemma 3 (text) on the Llama machinery: what differs is passed in, nothing is rewritten.

Against the Llama layer (Gemma Team, "Gemma 3 Technical Report", 2025; HF's modeling_gemma3.py):
  * the embedding is scaled by sqrt(hidden) (in the stream's dtype, as HF does);
  * each q and k head is RMS-normalised over its D values before RoPE (QK-norm);
  * each sub-layer's output is normalised before it joins the stream (post-attention, post-MLP norms);
  * the MLP gate is GeGLU (gelu, tanh approximation);
  * five of every six layers attend to a sliding window of the last `sliding_window` positions with
    RoPE base 10,000; every sixth attends globally with the header's base (1e6).
GGUF stores every Gemma norm weight as 1 + w already (llama.cpp's converter adds the 1), so they are
plain RMSNorm weights here. The window lives in the attention (attention/paged.py); the layers'
blocks are still held for the global layers, which read the whole context.
"""
from __future__ import annotations

import torch

from ..loading.weights import ModelArch, as_dense
from .layers import Rotary
from .llama import LlamaModel, load_layer


def load_gemma3_layer(arch: ModelArch, w: dict, i: int, dtype, device, use_blocks: bool, activations: str = "fp32"):
    layer = load_layer(arch, w, i, dtype, device, use_blocks, activations)
    norm = lambda n: as_dense(w[f"layers.{i}.{n}"]).to(device, dtype)
    layer.q_norm, layer.k_norm = norm("q_norm"), norm("k_norm")
    layer.post_attn_norm, layer.post_ffn_norm = norm("post_attn_norm"), norm("post_ffn_norm")
    layer.act = "gelu_tanh"
    return layer


class DualRotary:
    """RoPE tables for both kinds of layer: tables(positions) -> ((cos_global, cos_local), (sin_global, sin_local)),
    each [T, D]; Gemma3Model.layer_rope picks a layer's pair."""

    def __init__(self, global_: Rotary, local: Rotary):
        self.global_, self.local = global_, local

    def tables(self, positions: torch.Tensor):
        (cg, sg), (cl, sl) = self.global_.tables(positions), self.local.tables(positions)
        return (cg, cl), (sg, sl)


class Gemma3Model(LlamaModel):
    graphable = False  # cuda/forward.py graphs the Llama layer only
    load_layer = staticmethod(load_gemma3_layer)

    def __init__(self, arch: ModelArch, weights: dict, dtype: torch.dtype, device: torch.device,
                 use_blocks: bool = True, max_len=None, activations: str = "fp32"):
        super().__init__(arch, weights, dtype, device, use_blocks=use_blocks, max_len=max_len, activations=activations)
        rows = self.embed_rows
        scale = torch.tensor(arch.hidden_size ** 0.5, dtype=dtype)  # HF rounds sqrt(hidden) to the dtype first
        self.embed_rows = lambda ids: rows(ids).to(dtype) * scale
        local = Rotary(arch.head_dim, arch.rope_local_theta or arch.rope_theta, None, self.max_len, None, device)
        self.rotary = DualRotary(self.rotary, local)

    def layer_rope(self, li: int, cos, sin):
        """cos/sin from DualRotary.tables: each layer takes its kind's (local where it has a window)."""
        kind = 1 if self.windows[li] else 0
        return cos[kind], sin[kind]
