"""The target model as a plain dense causal transformer, for training drafts on whole [B, L] chunks.

The serving model (models/llama.py) runs one flat ragged batch over a paged cache; training wants
batched full-sequence passes without a cache, on whatever device trains. Same weights, same maths
(parity with the serving model is tested).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..loading.weights import ModelArch, as_dense
from ..models.layers import Rotary


class DenseTarget:
    def __init__(self, arch: ModelArch, weights: dict, device: torch.device, dtype: torch.dtype = torch.float32):
        self.arch, self.device, self.dtype = arch, device, dtype
        d = lambda name: as_dense(weights[name]).to(device, dtype)
        self.layers = []
        for i in range(arch.num_hidden_layers):
            p = f"layers.{i}."
            qkv = torch.cat([d(p + n) for n in ("q", "k", "v")])
            bias = torch.cat([d(p + n) for n in ("q_bias", "k_bias", "v_bias")]) if arch.attention_bias else None
            self.layers.append((d(p + "attn_norm"), qkv, bias, d(p + "o"), d(p + "ffn_norm"),
                                torch.cat([d(p + "gate"), d(p + "up")]), d(p + "down")))
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
        H, Hkv, D = a.num_attention_heads, a.num_key_value_heads, a.head_dim
        B, L = ids.shape
        cos, sin = self.rope_tables(L)
        c, s = cos[None, :, None, :].to(self.dtype), sin[None, :, None, :].to(self.dtype)
        half = D // 2
        rot = lambda x: x * c + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * s
        x = F.embedding(ids, self.embed)
        for attn_norm, qkv, bias, o, ffn_norm, gate_up, down in self.layers:
            q, k, v = F.linear(self.rms(x, attn_norm), qkv, bias).split([H * D, Hkv * D, Hkv * D], dim=-1)
            q, k, v = rot(q.view(B, L, H, D)), rot(k.view(B, L, Hkv, D)), v.view(B, L, Hkv, D)
            att = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 is_causal=True, enable_gqa=Hkv != H)
            x = x + F.linear(att.transpose(1, 2).reshape(B, L, H * D), o)
            gate, up = F.linear(self.rms(x, ffn_norm), gate_up).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, down)
        return x

    def rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.arch.rms_norm_eps)).to(x.dtype)

    def logits(self, hidden: torch.Tensor, rows: torch.Tensor = None) -> torch.Tensor:
        """[..., hidden] -> logits [..., vocab] (or only the head rows asked for) in fp32."""
        head = self.lm_head if rows is None else self.lm_head[rows]
        return F.linear(self.rms(hidden, self.norm), head).float()
