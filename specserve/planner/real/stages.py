"""One pipeline stage of a Llama model: a contiguous run of its layers, for one request at a time.

A request is one forward pass over a fixed-length prompt that ends in the next token, the
AlpaServe setting (each request costs the same, known time). The profile counts the model as
[embedding, layer 0 .. layer L-1, final norm + head]; a stage covers a contiguous range of those
units, so stage 0 takes token ids and the last stage returns the next token id. Between stages
flows the residual stream [T, hidden].
"""
from __future__ import annotations

import torch

from ...attention.paged import AttentionMetadata
from ...kv.cache import KVCache
from ...loading import load_model_files
from ...models import build_model

BLOCK_SIZE = 16


def load_model(model_path=None):
    """The model as the engine's CPU path builds it (fp32 compute over quantized blocks)."""
    _, arch, weights, _ = load_model_files(model_path, keep_quantized=True)
    return build_model(arch, weights, torch.float32, torch.device("cpu"))


def num_units(model) -> int:
    return model.arch.num_hidden_layers + 2


class PipelineStage:
    def __init__(self, model, unit_start: int, unit_end: int, tokens: int):
        n = num_units(model)
        if not 0 <= unit_start < unit_end <= n:
            raise ValueError(f"stage units [{unit_start}, {unit_end}) out of range for a {n}-unit model")
        self.model, self.tokens = model, tokens
        self.first, self.last = unit_start == 0, unit_end == n
        self.layer_start = max(unit_start, 1) - 1
        self.layer_end = min(unit_end, n - 1) - 1
        num_layers = max(0, self.layer_end - self.layer_start)
        blocks = -(-tokens // BLOCK_SIZE)
        a = model.arch
        self.kv = KVCache(max(1, num_layers), blocks, BLOCK_SIZE, a.num_key_value_heads, a.head_dim, model.dtype,
                          torch.device("cpu"))
        self.meta = AttentionMetadata.build([tokens], [tokens], [list(range(blocks))], BLOCK_SIZE,
                                            torch.device("cpu"), mode="split")
        self.cos, self.sin = model.rotary.tables(torch.arange(tokens))
        self.last_row = torch.tensor([tokens - 1])

    @property
    def input_shape(self) -> tuple:
        return (self.tokens,) if self.first else (self.tokens, self.model.arch.hidden_size)

    @property
    def input_dtype(self) -> torch.dtype:
        return torch.long if self.first else self.model.dtype

    @torch.inference_mode()
    def run(self, inp: torch.Tensor) -> torch.Tensor:
        """token ids [T] (first stage) or residual stream [T, hidden] -> residual stream [T, hidden],
        or the next token id [1] (last stage)."""
        m = self.model
        x = m.embed_rows(inp).to(m.dtype) if self.first else inp.clone()  # [T, hidden]
        x, delta = m.run_layers(x, None, self.layer_start, self.layer_end, self.cos, self.sin, self.meta,
                                self.kv.k, self.kv.v)
        if delta is not None:
            x = x + delta
        if self.last:
            return m.head(x, self.last_row).argmax(-1)  # [1]
        return x
