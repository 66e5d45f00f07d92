"""The Llama family (Llama 2/3, Mistral, Qwen2, SmolLM2) over one flat ragged batch.

forward(token_ids [T], positions [T], attention metadata, logits_indices [S]) -> logits [S, vocab]:
the T tokens of all sequences are concatenated; only the S rows asked for go through the LM head.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .. import kernels
from ..attention.paged import AttentionMetadata
from ..loading.weights import ModelArch, QuantizedWeight, as_dense
from .decoder import LayerWeights, decoder_layer, fused_decoder_layer, fused_layer_weights, paged, runs_fused
from .layers import Linear, Rotary, rms_norm


def load_layer(arch: ModelArch, w: dict, i: int, dtype, device, use_blocks: bool, activations: str = "fp32") -> LayerWeights:
    """Layer i's canonical weights as Linear products (blocked where the kernels take them)."""
    lin = lambda names, bias=None: Linear([get(n) for n in names], bias, dtype, device, use_blocks, activations)  # noqa: E731
    p = f"layers.{i}."
    get = lambda n: w.get(p + n)
    qkv_bias = None
    if arch.attention_bias:
        qkv_bias = torch.cat([as_dense(get(n)) for n in ("q_bias", "k_bias", "v_bias")])
    return LayerWeights(
        attn_norm=as_dense(get("attn_norm")).to(device, dtype),
        ffn_norm=as_dense(get("ffn_norm")).to(device, dtype),
        qkv=lin(("q", "k", "v"), qkv_bias), o=lin(("o",)), gate_up=lin(("gate", "up")), down=lin(("down",)))


class LlamaModel:
    # Whether cuda/forward.py's graphed steps take this model's layers (the Llama layer only).
    graphable = True

    def __init__(self, arch: ModelArch, weights: dict, dtype: torch.dtype, device: torch.device,
                 use_blocks: bool = True, max_len: Optional[int] = None, activations: str = "fp32"):
        self.arch, self.dtype, self.device, self.activations = arch, dtype, device, activations
        self.num_heads, self.num_kv_heads, self.head_dim = arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim
        self.eps = arch.rms_norm_eps
        use_blocks = use_blocks and device.type == "cpu" and dtype == torch.float32 and kernels.available()
        self.use_blocks = use_blocks  # whether the projections run on the CPU block kernels (a draft model follows)
        self.layers = [self.load_layer(arch, weights, i, dtype, device, use_blocks, activations) for i in range(arch.num_hidden_layers)]
        self.norm = as_dense(weights["norm"]).to(device, dtype)
        embed = weights["embed"]
        head = embed if arch.tie_word_embeddings else weights["lm_head"]
        self.lm_head = Linear([head], None, dtype, device, use_blocks, activations)
        if head is embed and isinstance(self.lm_head.block, kernels.GgufWeight):
            self.embed_rows = self.lm_head.block.rows  # tied, in place: rows decoded from the head's blocks
        elif isinstance(embed, QuantizedWeight) and use_blocks and kernels.GgufWeight.supports(embed.type_name) \
                and (head is not embed or isinstance(self.lm_head.block, kernels.Int8Weight)):
            self.embed_rows = kernels.GgufWeight([embed]).rows  # read in place from the file
        else:
            # Tied legacy blocks: the head's dense copy (kept for prefill-sized products anyway) is the
            # table; one gather, where dequantising the looked-up rows costs ~8 small ops per step.
            table = self.lm_head.dense if head is embed else as_dense(embed).to(device, dtype)
            self.embed_rows = lambda ids: F.embedding(ids, table)
        self.max_len = max_len or arch.max_position_embeddings
        self.rotary = Rotary(arch.head_dim, arch.rope_theta, arch.rope_scaling, self.max_len, weights.get("rope_freqs"),
                             device)
        self.scale = arch.head_dim ** -0.5
        # Decode-sized steps run each layer as one C++ call when every projection is blocked.
        fused = [fused_layer_weights(layer, self.head_dim) for layer in self.layers]
        self.fused_layers = fused if all(w is not None for w in fused) else None
        # Sliding-window layers (Mistral's window; Gemma 3's local layers) attend to their window only.
        self.windows = [arch.layer_window(i) for i in range(arch.num_hidden_layers)]

    load_layer = staticmethod(load_layer)

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights read per decode step (what bounds batch-1 speed)."""
        return sum(self.unit_bytes()[1:])

    def unit_bytes(self) -> list[int]:
        """Weight bytes of [embedding, layer 0 .. L-1, final norm + head] (the planner's units; the
        embedding counts as the head's table, which the embedded model ties to it)."""
        layers = [_nbytes(w.attn_norm) + _nbytes(w.ffn_norm) + sum(_linear_bytes(l) for l in (w.qkv, w.o, w.gate_up, w.down))
                  for w in self.layers]
        table = _linear_bytes(self.lm_head)
        return [table] + layers + [table + _nbytes(self.norm)]

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                k_cache: torch.Tensor, v_cache: torch.Tensor, logits_indices: torch.Tensor,
                return_hidden: bool = False, head_rows=None):
        """token_ids, positions [T]; k_cache/v_cache [layers, slots, kv_heads, D]; logits_indices [S]
        -> logits [S, vocab] float32; with return_hidden, also the last hidden state of every row before
        the final norm [T, hidden] (what an EAGLE draft reads). head_rows: a reduced head (`head_rows`),
        logits [S, V'] over its rows instead."""
        x = self.embed_rows(token_ids).to(self.dtype)  # [T, hidden] residual stream
        cos, sin = self.rotary.tables(positions)  # [T, D] each
        x, delta = self.run_layers(x, None, 0, len(self.layers), cos, sin, meta, k_cache, v_cache)
        x = x + delta
        logits = self.head(x, logits_indices, head_rows)
        return (logits, x) if return_hidden else logits

    def run_layers(self, x: torch.Tensor, delta: Optional[torch.Tensor], start: int, end: int, cos, sin,
                   meta: AttentionMetadata, k_cache: torch.Tensor, v_cache: torch.Tensor):
        """Layers [start, end) on the residual stream x [T, hidden] (+ the pending sub-layer output delta);
        k_cache/v_cache hold just these layers. Returns (x, delta). Decode-sized steps run each layer as
        one C++ call when every projection is blocked. A pipeline stage is one call (planner.real.stages)."""
        H, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        fused = self.fused_layers is not None and runs_fused(self.fused_layers, x.shape[0], meta)
        for li in range(start, end):
            kc, vc = k_cache[li - start], v_cache[li - start]
            c, s = self.layer_rope(li, cos, sin)
            if fused:
                x, delta = fused_decoder_layer(x, delta, self.fused_layers[li], self.eps, c, s, kc, vc, meta,
                                               self.scale, H, Hkv, D, self.windows[li])
            else:
                x, delta = decoder_layer(x, delta, self.layers[li], c, s,
                                         paged(kc, vc, meta, self.scale, self.windows[li]), self.eps, H, Hkv, D)
        return x, delta

    def layer_rope(self, li: int, cos, sin):
        """Layer li's cos/sin [T, D] out of self.rotary.tables(positions) (one pair for every layer here)."""
        return cos, sin

    # --- the TargetView drafters and pipeline stages use (models/__init__.py) ---------------------
    def head(self, x: torch.Tensor, logits_indices: torch.Tensor, head_rows=None) -> torch.Tensor:
        """Residual stream x [T, hidden] -> logits [S, vocab] float32 of the rows asked for ([S, V'] through
        a reduced head, `head_rows`)."""
        h = rms_norm(x[logits_indices].contiguous(), self.norm, self.eps)  # [S, hidden]: only rows that sample
        return (self.lm_head(h) if head_rows is None else head_rows(h.float())).float()

    def final_norm(self, x: torch.Tensor) -> torch.Tensor:
        """The final RMSNorm of x [B, hidden], computed in x's dtype."""
        return rms_norm(x, self.norm if x.dtype == self.norm.dtype else self.norm.to(x.dtype), self.eps)

    @property
    def blocked_head(self) -> bool:
        """Whether the LM head runs on the block kernels (the fp32 CPU path)."""
        return self.lm_head.block is not None

    def head_rows(self, ids: torch.Tensor):
        """A product with just the LM head rows `ids` [V'] (a draft's reduced vocabulary):
        [B, hidden] float32 -> [B, V'] float32; on the block kernels when the head is blocked."""
        if self.lm_head.block is not None:
            return self.lm_head.block.select_rows(ids.cpu()).matmul
        rows = self.lm_head.dense_weight().index_select(0, ids).float().contiguous()  # [V', hidden]
        return lambda x: F.linear(x, rows)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _linear_bytes(lin: Linear) -> int:
    return lin.block.nbytes if lin.block is not None else _nbytes(lin.dense)
