"""The Llama forward of a static step: the model's own weights, inputs read from StaticInputs.

Every op has a fixed shape for a given token count T (the captured size), reads its per-step
values from the buffers and writes the KV cache in place, so `torch.cuda.graph` can capture it
once per T and replay it for any step that pads up to T. The maths is models.decoder.decoder_layer's
with the fused ops of cuda/ops.py (Triton) or their torch references (use_triton=False: CPU tests).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from ..attention.triton_paged import attention_torch, attention_triton
from . import linear, ops
from .buffers import StaticInputs


class StaticForward:
    def __init__(self, model, k_cache: torch.Tensor, v_cache: torch.Tensor, inputs: StaticInputs, use_triton: bool,
                 invariant: bool = False, head: Optional[Callable[[torch.Tensor], torch.Tensor]] = None):
        """model: a models.llama.LlamaModel with dense projections (CUDA, or CPU without block
        kernels); k_cache/v_cache [layers, slots, Hkv, D] (kv.cache.KVCache's); invariant: the
        projections and LM head by cuda/linear.py's fixed tiling (each row's bits independent of the
        pass's other rows) instead of the library's matmul; head: a reduced LM head in place of the
        model's (LlamaModel.head_rows, [S, hidden] float32 -> [S, V'] float32: a draft model's cut
        vocabulary)."""
        if any(lin.block is not None for w in model.layers for lin in (w.qkv, w.o, w.gate_up, w.down)):
            raise ValueError("a static step needs dense projections (the block kernels are the CPU path)")
        self.model, self.k_cache, self.v_cache, self.inputs = model, k_cache, v_cache, inputs
        self.norm = ops.add_rms_norm_triton if use_triton else ops.add_rms_norm_torch
        self.rope_store = ops.rope_store_triton if use_triton else ops.rope_store_torch
        self.silu_mul = ops.silu_mul_triton if use_triton else ops.silu_mul_torch
        self.attend = attention_triton if use_triton else attention_torch
        if invariant and not linear.available():
            raise ValueError("batch_invariant needs triton")
        self.lin = linear.project if invariant else (lambda lin, x: lin(x))
        self.head = head

    @torch.inference_mode()
    def __call__(self, T: int, logits_rows: Optional[torch.Tensor] = None,
                 out: Optional[tuple[torch.Tensor, torch.Tensor]] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's first T buffer rows -> (logits [T, vocab] float32, hidden [T, hidden]: the last
        hidden state before the final norm, what EAGLE reads). logits_rows [S]: only those rows go
        through the LM head (outside graphs: a prompt chunk's logits would be [T, vocab]). out: buffers
        [>= T, vocab] float32 and [>= T, hidden] to write into and return views of (every captured
        graph writes the same ones, instead of holding outputs of its own: ~0.9 GB of logits over 20
        graphs at a 152k vocabulary)."""
        m, inp = self.model, self.inputs
        H, Hkv, D, eps = m.num_heads, m.num_kv_heads, m.head_dim, m.eps
        positions, slots = inp.positions[:T], inp.slots[:T]
        x = m.embed_rows(inp.ids[:T]).to(m.dtype).contiguous()  # [T, hidden]
        cos, sin = m.rotary.cos, m.rotary.sin  # [max_len, D] float32, looked up by position in rope_store
        delta = None
        for li, w in enumerate(m.layers):
            kc, vc = self.k_cache[li], self.v_cache[li]
            x, h = self.norm(x, delta, w.attn_norm, eps)
            qkv = self.lin(w.qkv, h)  # [T, (H + 2 Hkv) D], bias included
            self.rope_store(qkv, positions, cos, sin, kc, vc, slots, H, Hkv, D)  # q rotated in place; k, v cached
            q = qkv[:, :H * D].view(T, H, D)  # a strided view: row stride (H + 2 Hkv) D
            a = self.attend(q, kc, vc, inp, m.scale).reshape(T, H * D)
            x, h = self.norm(x, self.lin(w.o, a), w.ffn_norm, eps)
            delta = self.lin(w.down, self.silu_mul(self.lin(w.gate_up, h)))
        x, h = self.norm(x, delta, m.norm, eps)
        if logits_rows is not None:
            h = h.index_select(0, logits_rows)
        if out is None:
            return self._logits(h).float(), x
        logits, hidden = out[0][:T], out[1][:T]
        logits.copy_(self._logits(h))  # the cast to float32 that .float() would make, into the buffer
        hidden.copy_(x)
        return logits, hidden

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        """The final norm's rows [S, hidden] -> logits [S, V] (the model's dtype; float32 from a reduced head)."""
        return self.lin(self.model.lm_head, h) if self.head is None else self.head(h.float())
