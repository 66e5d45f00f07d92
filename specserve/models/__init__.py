"""Model implementations. Which class serves an architecture is `specserve.registry.ARCHITECTURES`."""
from __future__ import annotations

from typing import Callable, Protocol

import torch

from ..registry import ARCHITECTURES, resolve
from .llama import LlamaModel


class TargetView(Protocol):
    """What drafters and the planner's pipeline stages may use of a serving model, and nothing more."""

    arch: object  # loading.weights.ModelArch
    dtype: torch.dtype
    device: torch.device
    max_len: int  # positions the rotary tables cover
    rotary: object  # models.layers.Rotary: tables(positions) -> cos, sin
    blocked_head: bool
    activations: str  # config.ACTIVATIONS: what the block kernels dot the weights with (a draft model follows it)

    def embed_rows(self, ids: torch.Tensor) -> torch.Tensor: ...  # [T] -> [T, hidden]
    def final_norm(self, x: torch.Tensor) -> torch.Tensor: ...  # [B, hidden] -> [B, hidden]
    def head(self, x: torch.Tensor, logits_indices: torch.Tensor) -> torch.Tensor: ...  # [T, hidden] -> [S, vocab]
    def head_rows(self, ids: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]: ...  # [B, hidden] -> [B, V']
    def run_layers(self, x, delta, start: int, end: int, cos, sin, meta, k_cache, v_cache): ...  # a pipeline stage
    def unit_bytes(self) -> list[int]: ...  # weight bytes of [embedding, layers, norm + head]
    # the whole model over a KV cache of the caller's (a staged level that is the target itself)
    def forward(self, token_ids, positions, meta, k_cache, v_cache, logits_indices, head_rows=None) -> torch.Tensor: ...
    weight_bytes: int


def build_model(arch, weights, dtype, device, use_blocks=True, max_len=None, activations="fp32"):
    cls = resolve(ARCHITECTURES.get(arch.architecture).model)  # the entry's "module:Class"
    return cls(arch, weights, dtype, device, use_blocks=use_blocks, max_len=max_len,
               activations=activations)


__all__ = ["LlamaModel", "TargetView", "build_model"]
