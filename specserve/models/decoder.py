"""The Llama decoder layer, written once.

`decoder_layer` is the reference: RMSNorm -> q/k/v with rotate-half RoPE -> attention -> o ->
RMSNorm -> SwiGLU MLP, on a residual stream of any leading shape ([T, hidden] flat ragged batches,
[B, L, hidden] training chunks). Gemma 3's layer is the same with four more norms (each q and k head
before RoPE; each sub-layer's output before it joins the stream) and GeGLU: LayerWeights carries
them, None / "silu" for the Llama family. What differs between its users is passed in, not rewritten:
  * the projections, as callables (models.layers.Linear over GGML blocks or dense weights,
    nn.Linear for training with autograd, F.linear over dense tensors);
  * the attention, as `attend(q, k, v)`: `paged(...)` over a paged KV cache (serving: the target,
    the EAGLE draft, the planner's pipeline stages) or `causal` SDPA over whole chunks (training).
Users: models/llama.py (target), models/eagle.py (EAGLE draft, serving and training),
training/target.py (the dense target that trains drafts), planner/real/stages.py via LlamaModel.

The residual stream is carried as (x, delta): the sub-layer output not yet added to x. Serving adds
it inside the next RMSNorm (one pass over x, as the fused C++ kernels do); the sums are the same.

`fused_decoder_layer` is the fast path for decode-sized CPU steps over blocked weights (fp32 or int8
activations): the whole layer, Gemma 3's included, in one C++ call (kernels/decoder_layer.cpp), tested
bit for bit against `decoder_layer` (tests/model/test_decoder_layer.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

import torch
import torch.nn.functional as F

from .. import kernels
from ..attention.paged import AttentionMetadata, paged_attention
from .layers import BLOCK_KERNEL_MAX_ROWS, BLOCK_KERNEL_MAX_ROWS_AMX, GATED_ACTIVATIONS, add_rms_norm, head_norm, rms_norm, rope_qkv

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor  # [hidden]
    ffn_norm: torch.Tensor  # [hidden]
    qkv: Callable  # [..., hidden] -> [..., (H + 2 Hkv) D] (q, k, v stacked, with their bias if any)
    o: Callable  # [..., H D] -> [..., hidden]
    gate_up: Callable  # [..., hidden] -> [..., 2 F] (gate | up)
    down: Callable  # [..., F] -> [..., hidden]
    # Gemma 3 (None for the Llama family): QK-norm and the sub-layers' output norms
    q_norm: Optional[torch.Tensor] = None  # [D]
    k_norm: Optional[torch.Tensor] = None  # [D]
    post_attn_norm: Optional[torch.Tensor] = None  # [hidden]
    post_ffn_norm: Optional[torch.Tensor] = None  # [hidden]
    act: str = "silu"  # the MLP's gate: "silu" (SwiGLU) | "gelu_tanh" (GeGLU)


def decoder_layer(x: torch.Tensor, delta: Optional[torch.Tensor], w: LayerWeights, cos: torch.Tensor,
                  sin: torch.Tensor, attend: Attend, eps: float, H: int, Hkv: int, D: int):
    """x [..., hidden] residual stream, delta the previous sub-layer's output not yet added (None: none);
    cos/sin [..., D] broadcastable to the tokens' positions; attend(q [..., H, D], k, v [..., Hkv, D])
    -> [..., H, D]. Returns (x, delta): the stream and this layer's MLP output, not yet added."""
    x, h = add_rms_norm(x, delta, w.attn_norm, eps)
    qkv = w.qkv(h)
    if w.q_norm is not None:
        q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
        qkv = torch.cat([head_norm(q, H, D, w.q_norm, eps), head_norm(k, Hkv, D, w.k_norm, eps), v], dim=-1)
    q, k, v = rope_qkv(qkv, cos, sin, H, Hkv, D)
    out = w.o(attend(q, k, v).flatten(-2))
    if w.post_attn_norm is not None:
        out = rms_norm(out, w.post_attn_norm, eps)
    x, h = add_rms_norm(x, out, w.ffn_norm, eps)
    out = w.down(GATED_ACTIVATIONS[w.act](w.gate_up(h)))
    if w.post_ffn_norm is not None:
        out = rms_norm(out, w.post_ffn_norm, eps)
    return x, out


def paged(k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
          window: int = 0) -> Attend:
    """Attention over a flat ragged batch with a paged KV cache (k_cache/v_cache [slots, Hkv, D]);
    window > 0: a sliding-window layer's."""
    return lambda q, k, v: paged_attention(q, k, v, k_cache, v_cache, meta, scale, window)


def causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention over whole chunks: q [B, L, H, D], k/v [B, L, Hkv, D] -> [B, L, H, D]."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                         enable_gqa=k.shape[-2] != q.shape[-2])
    return out.transpose(1, 2)


class FusedLayer(NamedTuple):
    """A decoder layer's weights as kernels' decoder_layer takes them (blocked parts from Linear.block.parts())."""
    attn_norm: torch.Tensor  # [hidden]
    ffn_norm: torch.Tensor  # [hidden]
    qkv: list
    qkv_bias: Optional[torch.Tensor]
    o: list
    gate_up: list
    down: list
    q_norm: Optional[torch.Tensor]  # Gemma 3's extra norms (None for the Llama family)
    k_norm: Optional[torch.Tensor]
    post_attn_norm: Optional[torch.Tensor]
    post_ffn_norm: Optional[torch.Tensor]
    gelu: bool  # GeGLU (Gemma) rather than SwiGLU

    @property
    def projections(self) -> tuple:
        return self.qkv, self.o, self.gate_up, self.down


def fused_layer_weights(w: LayerWeights, head_dim: int) -> Optional[FusedLayer]:
    """Layer w as one C++ call takes it, or None when it cannot run as one (a dense projection, or a
    head size the attention kernel does not take)."""
    if any(lin.block is None for lin in (w.qkv, w.o, w.gate_up, w.down)) or head_dim % 8:
        return None
    return FusedLayer(w.attn_norm, w.ffn_norm, w.qkv.block.parts(), w.qkv.bias, w.o.block.parts(),
                      w.gate_up.block.parts(), w.down.block.parts(), w.q_norm, w.k_norm, w.post_attn_norm,
                      w.post_ffn_norm, {"silu": False, "gelu_tanh": True}[w.act])


def runs_fused(weights, num_rows: int, meta: AttentionMetadata) -> bool:
    """Whether a pass over num_rows rows runs each layer as one C++ call (weights: one layer's
    FusedLayer, or a list of them): decode-sized (as many rows as Linear would send to the block
    kernel) and on the paged attention kernel."""
    if weights is None or not meta.use_paged_kernel:
        return False
    layer = weights[0] if isinstance(weights, list) else weights  # all layers have the same shapes
    # blocked parts: six where they have an AMX copy (a GgufWeight's parts end in its int64 type list instead)
    packed = all(len(p) == 6 and p[-1].dtype != torch.int64 for p in layer.projections)
    return num_rows <= (BLOCK_KERNEL_MAX_ROWS_AMX if packed else BLOCK_KERNEL_MAX_ROWS)


def fused_decoder_layer(x: torch.Tensor, delta: Optional[torch.Tensor], w: FusedLayer, eps: float,
                        cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        meta: AttentionMetadata, scale: float, H: int, Hkv: int, D: int, window: int = 0):
    """`decoder_layer` with paged attention as one C++ call (window > 0: a sliding-window layer's).
    x [T, hidden] is updated in place with delta; returns (x, this layer's output)."""
    tables, q_starts, q_lens, kv_lens, span_lens, tree_mask = meta.paged_fields()
    out = kernels.ext().decoder_layer(x, delta, w.attn_norm, w.ffn_norm, eps, w.qkv, w.qkv_bias, w.o, w.gate_up, w.down,
                                      cos, sin, k_cache, v_cache, meta.slot_mapping, tables, q_starts, q_lens, kv_lens,
                                      meta.block_size, scale, H, Hkv, D, span_lens, tree_mask, w.q_norm, w.k_norm,
                                      w.post_attn_norm, w.post_ffn_norm, w.gelu, window)
    return x, out
