"""Graph-safe paged attention: every input comes from the static step buffers (cuda/buffers.py).

One program per (token, KV head) serves the G = H / Hkv query heads that share the KV head (GQA):
it walks its sequence's KV rows 0 .. limit[t] through the block table, BLOCK_N keys at a time, with
an online softmax (flash-attention's), and masks the rows of a token tree to the token's ancestors
(tree[t], from span_start[seq] on). Padding tokens (limit -1) run no iteration and write zeros.
Nothing depends on the step's sizes but tensors' contents, so a CUDA graph replays it for any
batch of chains and trees that fits its captured token count.

`attention_torch` computes the same from the same buffers in torch (CPU tests, no triton); the
kernels also run on CPU under Triton's interpreter (TRITON_INTERPRET=1), where the tests check them
against it and against the engine's reference attention (attention/paged.py).
"""
from __future__ import annotations

import torch

from ..cuda.buffers import StaticInputs

try:  # triton is optional: the CUDA image ships it; on CPU it only serves the interpreter tests
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised where triton is absent
    triton = None
    tl = None

BLOCK_N = 64  # keys per iteration: 4 KV blocks of 16


def available() -> bool:
    return triton is not None


def attention_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, inp: StaticInputs,
                    scale: float) -> torch.Tensor:
    """The reference over the buffers: q [T, H, D] (T = the padded step), k_cache/v_cache [slots, Hkv, D]
    of one layer, the new keys already written -> [T, H, D]. Not graph-safe (its key window is the
    step's longest limit)."""
    T, H, D = q.shape
    Hkv = k_cache.shape[1]
    limit = inp.limit[:T].long()
    n = int(limit.max().item()) + 1 if T else 0
    if n <= 0:
        return torch.zeros_like(q)
    seq = inp.seq[:T].long()
    bs = inp.block_size
    j = torch.arange(n, device=q.device)
    blocks = inp.tables.long()[seq][:, j // bs]  # [T, n]
    slots = blocks * bs + j % bs
    keys = k_cache[slots].float()  # [T, n, Hkv, D]
    values = v_cache[slots].float()
    start = inp.span_start.long()[seq]  # [T] first tree row of each token's sequence
    allowed = j[None, :] <= limit[:, None]
    rel = (j[None, :] - start[:, None]).clamp(0, inp.max_span - 1)
    in_tree = j[None, :] >= start[:, None]
    allowed &= ~in_tree | (inp.tree[:T].long().gather(1, rel) != 0)
    G = H // Hkv
    qg = q.float().view(T, Hkv, G, D)
    scores = torch.einsum("tkgd,tnkd->tkgn", qg, keys) * scale  # [T, Hkv, G, n]
    scores = scores.masked_fill(~allowed[:, None, None, :], float("-inf"))
    p = torch.softmax(scores, -1).nan_to_num(0.0)  # padding rows: no key, zero output
    out = torch.einsum("tkgn,tnkd->tkgd", p, values)
    return out.reshape(T, H, D).to(q.dtype)


if triton is not None:
    @triton.jit
    def _paged_attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, seq_ptr, limit_ptr, tables_ptr, span_ptr, tree_ptr,
                                stride_qt, stride_qh, stride_ks, stride_kh, stride_ot, stride_oh,
                                stride_tab, stride_tree, scale,
                                G: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                                BLOCK_N: tl.constexpr, IEEE: tl.constexpr):
        t = tl.program_id(0)
        kh = tl.program_id(1)
        seq = tl.load(seq_ptr + t)
        limit = tl.load(limit_ptr + t)
        span = tl.load(span_ptr + seq)
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, D)
        gmask = g < G
        q = tl.load(q_ptr + t * stride_qt + (kh * G + g)[:, None] * stride_qh + d[None, :],
                    mask=gmask[:, None], other=0.0)  # [BLOCK_G, D]
        m = tl.full([BLOCK_G], float("-inf"), tl.float32)
        den = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, D], tl.float32)
        for start in range(0, limit + 1, BLOCK_N):
            j = start + tl.arange(0, BLOCK_N)
            valid = j <= limit
            blk = tl.load(tables_ptr + seq * stride_tab + j // BS, mask=valid, other=0)
            slot = blk.to(tl.int64) * BS + j % BS
            k = tl.load(k_ptr + slot[:, None] * stride_ks + kh * stride_kh + d[None, :], mask=valid[:, None],
                        other=0.0)  # [BLOCK_N, D]
            v = tl.load(v_ptr + slot[:, None] * stride_ks + kh * stride_kh + d[None, :], mask=valid[:, None],
                        other=0.0)
            if IEEE:
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
            s = s * scale  # [BLOCK_G, BLOCK_N] fp32
            in_tree = valid & (j >= span)
            row = tl.load(tree_ptr + t * stride_tree + (j - span), mask=in_tree, other=1)
            valid = valid & (row != 0)
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a block with every key masked
            p = tl.exp(s - m_safe[:, None])
            alpha = tl.exp(m - m_safe)
            den = den * alpha + tl.sum(p, 1)
            if IEEE:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m = m_new
        out = acc / tl.maximum(den, 1e-30)[:, None]  # padding: no iteration, zeros
        tl.store(o_ptr + t * stride_ot + (kh * G + g)[:, None] * stride_oh + d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=gmask[:, None])


def attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, inp: StaticInputs,
                     scale: float) -> torch.Tensor:
    """q [T, H, D] (any row/head strides, last dim contiguous: a view into the qkv product),
    k_cache/v_cache [slots, Hkv, D] contiguous -> [T, H, D]."""
    T, H, D = q.shape
    Hkv = k_cache.shape[1]
    G = H // Hkv
    out = torch.empty(T, H, D, dtype=q.dtype, device=q.device)
    _paged_attention_kernel[(T, Hkv)](
        q, k_cache, v_cache, out, inp.seq, inp.limit, inp.tables, inp.span_start, inp.tree,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), out.stride(0), out.stride(1),
        inp.tables.stride(0), inp.tree.stride(0), scale,
        G=G, BLOCK_G=max(16, triton.next_power_of_2(G)), D=D, BS=inp.block_size, BLOCK_N=BLOCK_N,
        IEEE=q.dtype == torch.float32)
    return out
