"""Batch-invariant projections for the static step: y = x W^T (+ b) with one fixed tiling, so each row's
result is the same bits whatever the other rows of the pass.

cuBLAS picks its kernel (tile shape, split-K) by the row count M, and a kernel of another tiling sums
each dot product in another order. In bfloat16 that moves logits by a rounding step, so a verify pass
over 1 + K rows a sequence (or a token tree's 1 + W K) can pick another argmax than regular decoding's
one-row pass, and greedy speculation stops giving regular decoding's tokens: the trees of
bench/results/gpu/README.md (runs 7-8) did, eager as well as graphed. Here every program computes a
BLOCK_M x BLOCK_N tile over the whole K in BLOCK_K steps, in the same order, and rows past M are masked:
a row's sums do not depend on M or on its neighbours (vLLM's and SGLang's batch-invariant modes do the
same for their matmuls). `ModelConfig.batch_invariant` turns it on for the target's projections and LM
head on CUDA; float32 runs with IEEE products (no TF32).
"""
from __future__ import annotations

from typing import Optional

import torch

from ..attention.triton_paged import triton

if triton is not None:
    import triton.language as tl

# fixed: a tile must never depend on the pass's row count
BLOCK_M, BLOCK_N, BLOCK_K = 16, 64, 64


def available() -> bool:
    return triton is not None


if triton is not None:
    @triton.jit
    def _linear_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                       HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        k = tl.arange(0, BLOCK_K)
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + k
            x = tl.load(x_ptr + m[:, None] * stride_xm + kk[None, :], mask=(m[:, None] < M) & (kk[None, :] < K),
                        other=0.0)  # [BLOCK_M, BLOCK_K]
            w = tl.load(w_ptr + n[:, None] * stride_wn + kk[None, :], mask=(n[:, None] < N) & (kk[None, :] < K),
                        other=0.0)  # [BLOCK_N, BLOCK_K]
            if IEEE:
                acc += tl.dot(x, tl.trans(w), input_precision="ieee")
            else:
                acc += tl.dot(x, tl.trans(w))
        if HAS_BIAS:
            acc += tl.load(b_ptr + n, mask=n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + m[:, None] * stride_ym + n[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=(m[:, None] < M) & (n[None, :] < N))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x [M, K] (rows strided, last dim contiguous) @ weight [N, K]^T (+ bias [N]) -> [M, N] in x's dtype,
    each row computed as it would be alone."""
    M, K = x.shape
    N = weight.shape[0]
    if x.stride(-1) != 1:
        x = x.contiguous()
    w = weight if weight.stride(-1) == 1 else weight.contiguous()
    y = torch.empty(M, N, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
    _linear_kernel[grid](x, w, w if bias is None else bias, y, M, N, K, x.stride(0), w.stride(0), y.stride(0),
                         HAS_BIAS=bias is not None, IEEE=x.dtype == torch.float32,
                         BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
    return y


def project(lin, x: torch.Tensor) -> torch.Tensor:
    """A models.layers.Linear (dense) applied batch-invariantly."""
    return linear(x, lin.dense, lin.bias)
