"""Building blocks of the Llama family: linear layers over dense or GGML-blocked weights, RMSNorm, RoPE."""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch

from .. import kernels
from ..loading.weights import QuantizedWeight, as_dense

# Up to this many rows the block kernel beats dense fp32 (an unpacked block feeds several rows, and
# dense fp32 reads several times the bytes); above it (prefill) dense matrix-matrix products win, so
# Q4_0/Q4_1 layers also keep a dense copy. Measurements: docs/decisions.md#block-kernel-rows.
BLOCK_KERNEL_MAX_ROWS = 32
# With AMX tiles (block_matmul_amx.cpp, passes of 9+ rows) the block kernel stays ahead of dense far
# longer (docs/decisions.md#block-kernel-rows).
BLOCK_KERNEL_MAX_ROWS_AMX = 1024
# Regrouped for block_matmul.cpp (and its AMX build); other block types run in place (GgufWeight).
LEGACY_BLOCK_TYPES = ("Q4_0", "Q4_1")


class Linear:
    """y = x @ W^T (+ b). W is a dense [out, in] tensor, or GGML blocks run by the block kernels:
    Q4_0 / Q4_1 regrouped for block_matmul.cpp (with a dense copy for prefill-sized passes, or an AMX
    copy), every other block type read in place from the file by gguf_matmul.cpp for passes of any
    size (no copy of any kind)."""

    def __init__(self, weights: list, bias: Optional[torch.Tensor], dtype: torch.dtype, device: torch.device,
                 use_blocks: bool, activations: str = "fp32"):
        # Several weights with the same input (q, k, v or gate, up) are stacked into one product.
        self.block = None
        self.dense = None
        types = {w.type_name for w in weights if isinstance(w, QuantizedWeight)}
        blocked = use_blocks and all(isinstance(w, QuantizedWeight) for w in weights)
        if blocked and activations == "int8" and all(kernels.Int8Weight.supports(t) for t in types):
            self.block = kernels.Int8Weight(weights)  # every pass on the blocks: a row's bits never depend on M
            self.max_block_rows = None
        elif blocked and len(types) == 1 and weights[0].type_name in LEGACY_BLOCK_TYPES:
            raw = np.concatenate([w.raw for w in weights], axis=0)
            shape = (sum(w.shape[0] for w in weights), weights[0].shape[1])
            self.block = kernels.BlockWeight(weights[0].type_name, raw, shape)
            self.dense = self.block.dequantize()
            self.max_block_rows = BLOCK_KERNEL_MAX_ROWS_AMX if self.block.packed is not None else BLOCK_KERNEL_MAX_ROWS
        elif blocked and all(kernels.GgufWeight.supports(t) for t in types):
            self.block = kernels.GgufWeight(weights)
            self.max_block_rows = None  # every pass on the blocks
        else:
            self.dense = torch.cat([as_dense(w) for w in weights], 0).to(device=device, dtype=dtype)
        self.bias = None if bias is None else bias.to(device=device, dtype=dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [T, in] -> [T, out]
        if self.block is not None and (self.max_block_rows is None or x.shape[0] <= self.max_block_rows):
            y = self.block.matmul(x)
            return y if self.bias is None else y + self.bias
        return torch.nn.functional.linear(x, self.dense, self.bias)

    def dense_weight(self) -> torch.Tensor:
        """The dense [out, in] weight (the copy Linear keeps, or one dequantised now)."""
        return self.dense if self.dense is not None else self.block.dequantize()

    @property
    def kernel(self) -> str:
        """What runs this product: "int8" (q8_matmul.cpp), "gguf" (GGUF blocks in place, gguf_matmul.cpp),
        "blocks" (regrouped Q4_0 / Q4_1, block_matmul.cpp) or "dense" (torch)."""
        if self.block is None:
            return "dense"
        return {kernels.Int8Weight: "int8", kernels.GgufWeight: "gguf"}.get(type(self.block), "blocks")


def _fused(x: torch.Tensor) -> bool:
    """The fused C++ element-wise ops cover flat [T, n] fp32 CPU tensors outside autograd; everything
    else (GPU, bf16, training chunks) uses the torch references below."""
    return (x.dtype == torch.float32 and x.device.type == "cpu" and x.dim() == 2
            and not (x.requires_grad and torch.is_grad_enabled()) and kernels.available())


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The reference RMSNorm over the last dim, as HF's LlamaRMSNorm: normalise in fp32, scale in x's dtype."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """w * x / rms(x) (the C++ kernel where it applies, else rms_norm_ref)."""
    if _fused(x) and x.is_contiguous():
        return kernels.ext().rms_norm(x, None, weight, eps)
    return rms_norm_ref(x, weight, eps)


def add_rms_norm(x: torch.Tensor, residual: Optional[torch.Tensor], weight: torch.Tensor, eps: float):
    """The residual stream update and the next norm: (x + residual, rms_norm(x + residual)). On the
    C++ path x is updated in place (one pass over it); use the returned x either way."""
    if _fused(x) and x.is_contiguous():
        return x, kernels.ext().rms_norm(x, residual, weight, eps)
    if residual is not None:
        x = x + residual
    return x, rms_norm_ref(x, weight, eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[..., 2F] (gate | up) -> silu(gate) * up [..., F]."""
    if _fused(gate_up):
        return kernels.ext().silu_mul(gate_up.contiguous())
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def gelu_tanh_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[..., 2F] (gate | up) -> gelu_tanh(gate) * up [..., F] (GeGLU: Gemma's MLP)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.gelu(gate, approximate="tanh") * up


GATED_ACTIVATIONS = {"silu": silu_mul, "gelu_tanh": gelu_tanh_mul}


def head_norm(x: torch.Tensor, heads: int, D: int, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of each head of x [T, heads * D] over its D values (Gemma 3's QK-norm)."""
    # contiguous: one kernel for every shape (a lone KV head's [T, D] slice of qkv is strided)
    return rms_norm(x.reshape(-1, D).contiguous(), weight, eps).view(*x.shape[:-1], heads * D)


def rope_inv_freq(head_dim: int, theta: float, scaling: Optional[dict]) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling and scaling.get("rope_type", scaling.get("type")) == "llama3":
        # Llama 3.1: stretch long wavelengths by `factor`, keep short ones, blend in between.
        factor = scaling["factor"]
        lo, hi = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
        old_len = scaling.get("original_max_position_embeddings", 8192)
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / lo, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / hi) & (wavelen <= old_len / lo)
        inv_freq = torch.where(medium, smoothed, scaled)
    elif scaling and scaling.get("rope_type", scaling.get("type")) == "linear":  # positions divided by factor
        inv_freq = inv_freq / scaling["factor"]
    return inv_freq


class Rotary:
    """cos/sin tables for every position up to max_len, looked up by each token's position.

    On CPU the tables grow (doubling) to the highest position asked for, so a 32k-context model
    does not hold 32k rows it may never use (Gemma 3: 64 MB per table at D = 256). A row, once
    computed, never changes: a position gets the same bits in every step."""

    FIRST_ROWS = 4096

    def __init__(self, head_dim: int, theta: float, scaling: Optional[dict], max_len: int,
                 freq_factors: Optional[torch.Tensor], device: torch.device):
        inv_freq = rope_inv_freq(head_dim, theta, scaling)
        if freq_factors is not None:  # GGUF llama3 files ship the scaling as per-frequency divisors
            inv_freq = inv_freq / freq_factors.float()
        self.inv_freq, self.max_len, self.device = inv_freq, max_len, torch.device(device)
        self._cos = self._sin = torch.empty(0, head_dim, device=device)
        # the CUDA path looks rows up inside graphs: it gets every row at once
        self._grow(max_len if self.device.type != "cpu" else min(max_len, self.FIRST_ROWS))

    def _grow(self, rows: int):
        have = self._cos.shape[0]
        if rows <= have:
            return
        rows = min(self.max_len, max(rows, 2 * have))
        freqs = torch.arange(have, rows, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)  # [rows - have, head_dim]
        self._cos = torch.cat([self._cos, emb.cos().to(self.device)])
        self._sin = torch.cat([self._sin, emb.sin().to(self.device)])

    @property
    def cos(self) -> torch.Tensor:  # [max_len, D]
        self._grow(self.max_len)
        return self._cos

    @property
    def sin(self) -> torch.Tensor:  # [max_len, D]
        self._grow(self.max_len)
        return self._sin

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [T, D] for the step's token positions (looked up once, used by every layer)."""
        if self.device.type == "cpu" and positions.numel():
            self._grow(int(positions.max()) + 1)
        return self._cos.index_select(0, positions), self._sin.index_select(0, positions)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The reference rotate-half (NeoX) RoPE: x [..., heads, D]; cos/sin [..., D] (broadcast over heads)."""
    c, s = cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype)
    half = x.shape[-1] // 2
    return x * c + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * s


def rope_qkv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, H: int, Hkv: int, D: int):
    """Split qkv [..., (H + 2 Hkv) D] and rotate q and k. Returns q [..., H, D], k [..., Hkv, D],
    v [..., Hkv, D]. On the C++ path q and k are rotated in place inside qkv."""
    if _fused(qkv) and qkv.is_contiguous():
        kernels.ext().rope_(qkv, cos, sin, H + Hkv, D)
        q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
        return q.unflatten(-1, (H, D)), k.unflatten(-1, (Hkv, D)), v.unflatten(-1, (Hkv, D))
    q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
    return rope(q.unflatten(-1, (H, D)), cos, sin), rope(k.unflatten(-1, (Hkv, D)), cos, sin), v.unflatten(-1, (Hkv, D))
