"""What every loader hands to the model: an architecture config, named weights, a tokenizer.

Weights use one canonical naming scheme, whatever the file format:
  embed, norm, lm_head (absent when tied),
  layers.{i}.{attn_norm, ffn_norm, q, k, v, o, q_bias, k_bias, v_bias, gate, up, down}
  and Gemma 3's layers.{i}.{q_norm, k_norm, post_attn_norm, post_ffn_norm}
A weight is either a dense torch tensor or a `QuantizedWeight` (GGML blocks kept as stored, so the
model can run them through the block kernels instead of dequantising).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from .quants import QK, bits_per_weight, dequantize, requantize


@dataclass
class ModelArch:
    """Llama-family architecture hyper-parameters (HF naming)."""

    architecture: str  # a name in registry.ARCHITECTURES: "llama" | "mistral" | "qwen2" | "gemma3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None  # {"rope_type": "llama3", "factor", "low_freq_factor", ...}
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2: bias on q, k, v
    # Sliding-window attention (Gemma 3): `sliding_window` keys per query on the local layers; every
    # `global_every`-th layer (0: none) attends to the whole context with RoPE base rope_theta, the
    # local ones with rope_local_theta.
    sliding_window: Optional[int] = None
    global_every: int = 0
    rope_local_theta: Optional[float] = None
    bos_token_id: Optional[int] = None
    eos_token_ids: list[int] = field(default_factory=list)

    def layer_window(self, i: int) -> int:
        """Layer i's attention window in keys (0: the whole context)."""
        if not self.sliding_window or (self.global_every and (i + 1) % self.global_every == 0):
            return 0
        return self.sliding_window

    @property
    def num_params(self) -> int:
        h, f, L, d = self.hidden_size, self.intermediate_size, self.num_hidden_layers, self.head_dim
        attn = h * d * (self.num_attention_heads * 2 + self.num_key_value_heads * 2)
        per_layer = attn + 3 * h * f + 2 * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.vocab_size * h + L * per_layer + h + head


@dataclass
class QuantizedWeight:
    """A 2-D weight kept in GGML blocks: `raw` is [rows, bytes_per_row] uint8; shape is (rows, cols)."""

    type_name: str
    raw: np.ndarray
    shape: tuple[int, int]

    def dequantize(self) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(dequantize(self.raw, self.type_name, self.shape)))

    def permute_rows(self, order: np.ndarray) -> "QuantizedWeight":
        # Blocks run along a row, so reordering output rows never splits a block.
        return QuantizedWeight(self.type_name, self.raw[order], self.shape)


def requantize_weights(weights: dict, to: str) -> dict:
    """The weights with every blocked matrix wider than GGML type `to` (bits per weight) re-encoded as
    `to` (its rows whole blocks of 32), the embedding excepted: a pass reads one row of it per token."""
    out = {}
    for name, w in weights.items():
        if (isinstance(w, QuantizedWeight) and name != "embed" and w.shape[1] % QK == 0
                and bits_per_weight(w.type_name) > bits_per_weight(to)):
            w = QuantizedWeight(to, requantize(w.raw, w.type_name, w.shape, to), w.shape)
        out[name] = w
    return out


def as_dense(w, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    if isinstance(w, QuantizedWeight):
        w = w.dequantize()
    return w.to(dtype)
