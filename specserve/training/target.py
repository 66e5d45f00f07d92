"""The target model as a plain dense causal transformer, for training drafts on whole [B, L] chunks.

The serving model (models/llama.py) runs one flat ragged batch over a paged cache; training wants
batched full-sequence passes without a cache, on whatever device trains. Same weights, same maths
(parity with the serving model is tested).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..loading.weights import ModelArch, as_dense
from ..models.decoder import LayerWeights, causal, decoder_layer
from ..models.layers import Rotary, rms_norm_ref


class DenseTarget:
    def __init__(self, arch: ModelArch, weights: dict, device: torch.device, dtype: torch.dtype = torch.float32):
        self.arch, self.device, self.dtype = arch, device, dtype
        d = lambda name: as_dense(weights[name]).to(device, dtype)
        self.layers = []
        for i in range(arch.num_hidden_layers):
            p = f"layers.{i}."
            qkv = torch.cat([d(p + n) for n in ("q", "k", "v")])
            bias = torch.cat([d(p + n) for n in ("q_bias", "k_bias", "v_bias")]) if arch.attention_bias else None
            o, gate_up, down = d(p + "o"), torch.cat([d(p + "gate"), d(p + "up")]), d(p + "down")
            self.layers.append(LayerWeights(d(p + "attn_norm"), d(p + "ffn_norm"), _linear(qkv, bias), _linear(o),
                                            _linear(gate_up), _linear(down)))
        self.embed = d("embed")  # [vocab, hidden]
        self.norm = d("norm")
        self.lm_head = self.embed if arch.tie_word_embeddings else d("lm_head")
        self.rotary = Rotary(arch.head_dim, arch.rope_theta, arch.rope_scaling, arch.max_position_embeddings,
                             weights.get("rope_freqs"), device)

    def rope_tables(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rotary.tables(torch.arange(length, device=self.device))

    @torch.no_grad()
    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, L] -> last hidden state before the final norm [B, L, hidden] (what EAGLE reads)."""
        a = self.arch
        cos, sin = self.rope_tables(ids.shape[1])  # [L, D]
        x, delta = F.embedding(ids, self.embed), None  # [B, L, hidden]
        for layer in self.layers:
            x, delta = decoder_layer(x, delta, layer, cos, sin, causal, a.rms_norm_eps, a.num_attention_heads,
                                     a.num_key_value_heads, a.head_dim)
        return x + delta

    def rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return rms_norm_ref(x, w, self.arch.rms_norm_eps)

    def logits(self, hidden: torch.Tensor, rows: torch.Tensor = None) -> torch.Tensor:
        """[..., hidden] -> logits [..., vocab] (or only the head rows asked for) in fp32."""
        head = self.lm_head if rows is None else self.lm_head[rows]
        return F.linear(self.rms(hidden, self.norm), head).float()


def _linear(weight: torch.Tensor, bias: torch.Tensor = None):
    return lambda x: F.linear(x, weight, bias)
