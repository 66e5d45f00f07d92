"""The element-wise ops of a static step, each one kernel on CUDA (Triton), with torch references.

A graph replays every launch it captured, and a small model's step is its launches, not its bytes:
the torch forms of RMSNorm (7 kernels), RoPE (10 for q and k) and SwiGLU (3) made a decoder layer ~35
launches (docs/decisions.md#cuda-graphs). Fused, a layer is 9: add+norm, qkv, rope+KV store,
attention, o, add+norm, gate_up, silu*up, down. Rounding follows the torch references
(models/layers.py): sums and products are rounded to the activations' dtype where those round.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..attention.triton_paged import triton

if triton is not None:
    import triton.language as tl


def add_rms_norm_torch(x: torch.Tensor, delta: Optional[torch.Tensor], w: torch.Tensor, eps: float):
    """(x + delta, w * rms_norm(x + delta)) as models.layers.add_rms_norm's reference."""
    if delta is not None:
        x = x + delta
    x32 = x.float()
    return x, w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rope_store_torch(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, H: int, Hkv: int, D: int):
    """Rotate q in place inside qkv [T, (H + 2 Hkv) D] and write rotated k and v to the slots of the
    layer's cache [slots, Hkv, D] (slot -1: nowhere). cos/sin: the model's tables [max_len, D]."""
    T = qkv.shape[0]
    c, s = cos[positions.long()], sin[positions.long()]  # [T, D] fp32
    x = qkv[:, :(H + Hkv) * D].view(T, H + Hkv, D).float()
    half = D // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], -1)
    y = (x * c[:, None] + rot * s[:, None]).to(qkv.dtype)
    qkv[:, :H * D] = y[:, :H].reshape(T, H * D)
    keep = slots >= 0
    idx = slots[keep].long()
    k_cache[idx] = y[:, H:][keep]
    v_cache[idx] = qkv[:, (H + Hkv) * D:].view(T, Hkv, D)[keep]


def silu_mul_torch(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


if triton is not None:
    @triton.jit
    def _add_rms_norm_kernel(x_ptr, d_ptr, w_ptr, h_ptr, n, eps, HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr):
        r = tl.program_id(0)
        i = tl.arange(0, BLOCK)
        mask = i < n
        x = tl.load(x_ptr + r * n + i, mask=mask, other=0.0)
        if HAS_DELTA:
            d = tl.load(d_ptr + r * n + i, mask=mask, other=0.0)
            x = (x.to(tl.float32) + d.to(tl.float32)).to(x_ptr.dtype.element_ty)
            tl.store(x_ptr + r * n + i, x, mask=mask)
        x32 = x.to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(x32 * x32, 0) / n + eps)
        y = (x32 * inv).to(x_ptr.dtype.element_ty).to(tl.float32)
        w = tl.load(w_ptr + i, mask=mask, other=0.0).to(tl.float32)
        tl.store(h_ptr + r * n + i, (w * y).to(h_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _rope_store_kernel(qkv_ptr, pos_ptr, cos_ptr, sin_ptr, k_ptr, v_ptr, slot_ptr, stride_t, stride_cs,
                           stride_ks, H: tl.constexpr, Hkv: tl.constexpr, D: tl.constexpr):
        t = tl.program_id(0)
        h = tl.program_id(1)  # 0 .. H - 1: a query head; H .. H + Hkv - 1: a KV head
        HALF: tl.constexpr = D // 2
        i = tl.arange(0, HALF)
        pos = tl.load(pos_ptr + t)
        c = tl.load(cos_ptr + pos * stride_cs + i)
        s = tl.load(sin_ptr + pos * stride_cs + i)
        base = qkv_ptr + t * stride_t + h * D
        x1 = tl.load(base + i).to(tl.float32)
        x2 = tl.load(base + HALF + i).to(tl.float32)
        y1 = (x1 * c - x2 * s).to(qkv_ptr.dtype.element_ty)
        y2 = (x2 * c + x1 * s).to(qkv_ptr.dtype.element_ty)
        if h < H:
            tl.store(base + i, y1)
            tl.store(base + HALF + i, y2)
        else:
            slot = tl.load(slot_ptr + t).to(tl.int64)
            if slot >= 0:
                g = h - H
                dst = k_ptr + slot * stride_ks + g * D
                tl.store(dst + i, y1.to(k_ptr.dtype.element_ty))
                tl.store(dst + HALF + i, y2.to(k_ptr.dtype.element_ty))
                j = tl.arange(0, D)
                v = tl.load(qkv_ptr + t * stride_t + (H + Hkv + g) * D + j)
                tl.store(v_ptr + slot * stride_ks + g * D + j, v.to(v_ptr.dtype.element_ty))

    @triton.jit
    def _silu_mul_kernel(gu_ptr, out_ptr, F, BLOCK: tl.constexpr):
        t = tl.program_id(0)
        i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = i < F
        g = tl.load(gu_ptr + t * 2 * F + i, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(gu_ptr + t * 2 * F + F + i, mask=mask, other=0.0).to(tl.float32)
        act = (g / (1.0 + tl.exp(-g))).to(out_ptr.dtype.element_ty).to(tl.float32)
        tl.store(out_ptr + t * F + i, (act * u).to(out_ptr.dtype.element_ty), mask=mask)


def add_rms_norm_triton(x: torch.Tensor, delta: Optional[torch.Tensor], w: torch.Tensor, eps: float):
    """x [T, n] contiguous is updated in place with delta; returns (x, w * rms_norm(x))."""
    T, n = x.shape
    h = torch.empty_like(x)
    _add_rms_norm_kernel[(T,)](x, x if delta is None else delta, w, h, n, eps, HAS_DELTA=delta is not None,
                               BLOCK=triton.next_power_of_2(n))
    return x, h


def rope_store_triton(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, H: int, Hkv: int, D: int):
    T = qkv.shape[0]
    _rope_store_kernel[(T, H + Hkv)](qkv, positions, cos, sin, k_cache, v_cache, slots, qkv.stride(0), cos.stride(0),
                                     k_cache.stride(0), H=H, Hkv=Hkv, D=D)


def silu_mul_triton(gate_up: torch.Tensor) -> torch.Tensor:
    T, F2 = gate_up.shape
    F = F2 // 2
    out = torch.empty(T, F, dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _silu_mul_kernel[(T, triton.cdiv(F, block))](gate_up, out, F, BLOCK=block)
    return out
