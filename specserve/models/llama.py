"""The Llama family (Llama 2/3, Mistral, Qwen2, SmolLM2) over one flat ragged batch.

forward(token_ids [T], positions [T], attention metadata, logits_indices [S]) -> logits [S, vocab]:
the T tokens of all sequences are concatenated; only the S rows asked for go through the LM head.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .. import kernels
from ..attention.paged import AttentionMetadata, paged_attention
from ..loading.weights import ModelArch, QuantizedWeight, as_dense
from .layers import Linear, Rotary, fused_layer_weights, rms_norm, runs_fused, silu_mul


class DecoderLayer:
    def __init__(self, arch: ModelArch, w: dict, i: int, dtype, device, use_blocks: bool):
        p = f"layers.{i}."
        get = lambda n: w.get(p + n)
        self.attn_norm = as_dense(get("attn_norm")).to(device, dtype)
        self.ffn_norm = as_dense(get("ffn_norm")).to(device, dtype)
        qkv_bias = None
        if arch.attention_bias:
            qkv_bias = torch.cat([as_dense(get(n)) for n in ("q_bias", "k_bias", "v_bias")])
        self.qkv = Linear([get("q"), get("k"), get("v")], qkv_bias, dtype, device, use_blocks)
        self.o = Linear([get("o")], None, dtype, device, use_blocks)
        self.gate_up = Linear([get("gate"), get("up")], None, dtype, device, use_blocks)
        self.down = Linear([get("down")], None, dtype, device, use_blocks)


class LlamaModel:
    def __init__(self, arch: ModelArch, weights: dict, dtype: torch.dtype, device: torch.device,
                 use_blocks: bool = True, max_len: Optional[int] = None):
        self.arch, self.dtype, self.device = arch, dtype, device
        self.num_heads, self.num_kv_heads, self.head_dim = arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim
        self.eps = arch.rms_norm_eps
        use_blocks = use_blocks and device.type == "cpu" and dtype == torch.float32 and kernels.available()
        self.layers = [DecoderLayer(arch, weights, i, dtype, device, use_blocks) for i in range(arch.num_hidden_layers)]
        self.norm = as_dense(weights["norm"]).to(device, dtype)
        embed = weights["embed"]
        head = embed if arch.tie_word_embeddings else weights["lm_head"]
        self.lm_head = Linear([head], None, dtype, device, use_blocks)
        if head is not embed and isinstance(embed, QuantizedWeight) and use_blocks \
                and embed.type_name in kernels.BlockWeight.SUPPORTED:
            self.embed_rows = kernels.BlockWeight(embed.type_name, embed.raw, embed.shape).rows
        else:
            # Tied: the head's dense copy (kept for prefill-sized products anyway) is the table; one
            # gather, where dequantising the looked-up rows from blocks costs ~8 small ops per step.
            table = self.lm_head.dense if head is embed else as_dense(embed).to(device, dtype)
            self.embed_rows = lambda ids: F.embedding(ids, table)
        self.rotary = Rotary(arch.head_dim, arch.rope_theta, arch.rope_scaling,
                             max_len or arch.max_position_embeddings, weights.get("rope_freqs"), device)
        self.scale = arch.head_dim ** -0.5
        # Decode-sized steps run each layer as one C++ call when every projection is blocked.
        fused = [fused_layer_weights(l.attn_norm, l.ffn_norm, l.qkv, l.o, l.gate_up, l.down, self.head_dim)
                 for l in self.layers]
        self.fused_layers = fused if all(w is not None for w in fused) else None

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights read per decode step (what bounds batch-1 speed)."""
        nbytes = lambda t: t.numel() * t.element_size()
        total = nbytes(self.norm) + sum(nbytes(layer.attn_norm) + nbytes(layer.ffn_norm) for layer in self.layers)
        for lin in [self.lm_head] + [l for layer in self.layers for l in (layer.qkv, layer.o, layer.gate_up, layer.down)]:
            total += lin.block.nbytes if lin.block is not None else nbytes(lin.dense)
        return total

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                k_cache: torch.Tensor, v_cache: torch.Tensor, logits_indices: torch.Tensor,
                return_hidden: bool = False):
        """token_ids, positions [T]; k_cache/v_cache [layers, slots, kv_heads, D]; logits_indices [S]
        -> logits [S, vocab] float32; with return_hidden, also the last hidden state of every row before
        the final norm [T, hidden] (what an EAGLE draft reads)."""
        H, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        x = self.embed_rows(token_ids).to(self.dtype)  # [T, hidden] residual stream
        T = x.shape[0]
        cos, sin = self.rotary.tables(positions)  # [T, D] each
        delta = None  # the last sub-layer's output, added to x inside the next norm
        if runs_fused(self.fused_layers, T, meta):
            ext = kernels.ext()
            tables, q_starts, q_lens, kv_lens = meta.paged_fields()
            for li, (attn_norm, ffn_norm, qkv, qkv_bias, o, gate_up, down) in enumerate(self.fused_layers):
                delta = ext.decoder_layer(x, delta, attn_norm, ffn_norm, self.eps, qkv, qkv_bias, o, gate_up, down,
                                          cos, sin, k_cache[li], v_cache[li], meta.slot_mapping, tables, q_starts,
                                          q_lens, kv_lens, meta.block_size, self.scale, H, Hkv, D)
            return self._head(x + delta, logits_indices, return_hidden)
        x, delta = self.run_layers(x, None, 0, len(self.layers), cos, sin, meta, k_cache, v_cache)
        return self._head(x + delta, logits_indices, return_hidden)

    def run_layers(self, x: torch.Tensor, delta: Optional[torch.Tensor], start: int, end: int, cos, sin,
                   meta: AttentionMetadata, k_cache: torch.Tensor, v_cache: torch.Tensor):
        """Layers [start, end) on the residual stream x [T, hidden] (+ the pending sub-layer output delta);
        k_cache/v_cache hold just these layers. A pipeline stage is one call (planner.real.stages)."""
        H, D, T = self.num_heads, self.head_dim, x.shape[0]
        for li in range(start, end):
            layer = self.layers[li]
            h = rms_norm(x, layer.attn_norm, self.eps, residual=delta)
            q, k, v = Rotary.apply(layer.qkv(h), cos, sin, H, self.num_kv_heads, D)  # [T, heads, D]
            attn = paged_attention(q, k, v, k_cache[li - start], v_cache[li - start], meta, self.scale)
            h = rms_norm(x, layer.ffn_norm, self.eps, residual=layer.o(attn.reshape(T, H * D)))
            delta = layer.down(silu_mul(layer.gate_up(h)))  # [T, hidden]
        return x, delta

    def _head(self, x: torch.Tensor, logits_indices: torch.Tensor, return_hidden: bool):
        h = rms_norm(x[logits_indices].contiguous(), self.norm, self.eps)  # [S, hidden]: only rows that sample
        logits = self.lm_head(h).float()
        return (logits, x) if return_hidden else logits
