"""An EAGLE-style draft network (Li et al. 2024): one Llama decoder layer that reads the target's own
last hidden state.

Row t of the draft sees the target's hidden state f_t (the residual stream after the last layer, before
the final norm) and the embedding of the token at t + 1, and predicts f_{t+1}; the target's final norm
and (a slice of) its LM head turn that into a distribution over the token at t + 2. Predicting a
feature of the target rather than a token from scratch is what makes a 4 M-parameter draft accurate.
To draft further, the predicted feature is fed back in place of the target's.

The head covers only `vocab_ids` (the most frequent tokens of the training data): on this CPU the
full 49152 x 576 LM head costs as much as ~5 decoder layers, and the draft may simply never propose a
rare token (q = 0 there), which keeps rejection sampling exact.

Two forwards share the weights: `EagleNet.forward_dense` (training: [B, L] causal, autograd, pure
torch) and `EagleServing.forward` (inference: one flat ragged batch over the draft's own paged KV
cache; on the fp32 CPU path the projections are quantised to Q8_0 and run by the block kernels,
which reads 4x fewer bytes per draft step; the draft's choices may shift, never the output).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Optional

import torch
from torch import nn

from ..attention.paged import AttentionMetadata
from ..loading.weights import QuantizedWeight
from .decoder import LayerWeights, causal, decoder_layer, fused_decoder_layer, fused_layer_weights, paged, runs_fused
from .layers import Linear, Rotary

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


@dataclass
class EagleConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    target_vocab_size: int
    vocab_ids: list[int] = field(default_factory=list)  # target token ids the draft head covers
    rope_scaling: Optional[dict] = None
    tokenizer_sha256: str = ""  # the target tokenizer's fingerprint (Tokenizer.fingerprint)
    training: dict = field(default_factory=dict)  # how it was made: command, data, measured alpha / c

    @classmethod
    def for_target(cls, arch, vocab_ids: list[int], tokenizer_sha256: str = "") -> "EagleConfig":
        return cls(arch.hidden_size, arch.intermediate_size, arch.num_attention_heads, arch.num_key_value_heads,
                   arch.head_dim, arch.rms_norm_eps, arch.rope_theta, arch.vocab_size, list(vocab_ids),
                   arch.rope_scaling, tokenizer_sha256)


class EagleNet(nn.Module):
    def __init__(self, cfg: EagleConfig):
        super().__init__()
        self.cfg = cfg
        Hd, H, Hkv, D, Fd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size
        self.fc = nn.Linear(2 * Hd, Hd, bias=True)  # [token embedding | target feature] -> hidden
        self.attn_norm = nn.Parameter(torch.ones(Hd))
        self.qkv = nn.Linear(Hd, (H + 2 * Hkv) * D, bias=False)
        self.o = nn.Linear(H * D, Hd, bias=False)
        self.ffn_norm = nn.Parameter(torch.ones(Hd))
        self.gate_up = nn.Linear(Hd, 2 * Fd, bias=False)
        self.down = nn.Linear(Fd, Hd, bias=False)

    def init_from_target_layer(self, w: dict, i: int) -> None:
        """Start the decoder layer from target layer i (dense canonical weights); fc as [0 | I] so the
        untrained draft passes the target's feature through."""
        p = f"layers.{i}."
        with torch.no_grad():
            self.qkv.weight.copy_(torch.cat([w[p + n] for n in ("q", "k", "v")]).float())
            self.o.weight.copy_(w[p + "o"].float())
            self.gate_up.weight.copy_(torch.cat([w[p + "gate"], w[p + "up"]]).float())
            self.down.weight.copy_(w[p + "down"].float())
            self.attn_norm.copy_(w[p + "attn_norm"].float())
            self.ffn_norm.copy_(w[p + "ffn_norm"].float())
            Hd = self.cfg.hidden_size
            self.fc.weight.zero_()
            self.fc.weight[:, Hd:] = torch.eye(Hd)
            self.fc.bias.zero_()

    # --- training: [B, L] causal, pure torch so autograd works ----------------------------------
    def forward_dense(self, embeds: torch.Tensor, features: torch.Tensor, cos: torch.Tensor,
                      sin: torch.Tensor) -> torch.Tensor:
        """embeds, features [B, L, hidden]; cos/sin [L, D] -> predicted next features [B, L, hidden]."""
        cfg = self.cfg
        x = self.fc(torch.cat([embeds, features], dim=-1))
        w = LayerWeights(self.attn_norm, self.ffn_norm, self.qkv, self.o, self.gate_up, self.down)
        x, delta = decoder_layer(x, None, w, cos, sin, causal, cfg.rms_norm_eps, cfg.num_attention_heads,
                                 cfg.num_key_value_heads, cfg.head_dim)
        return x + delta

    # --- files --------------------------------------------------------------------------------
    def save(self, path: str, dtype: torch.dtype = torch.float16) -> None:
        from safetensors.torch import save_file
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, CONFIG_FILE), "w") as f:
            json.dump(asdict(self.cfg), f, indent=1)
        save_file({k: v.detach().to("cpu", dtype).contiguous() for k, v in self.state_dict().items()},
                  os.path.join(path, WEIGHTS_FILE))

    @classmethod
    def load(cls, path: str) -> "EagleNet":
        from safetensors.torch import load_file
        cfg_file, w_file = os.path.join(path, CONFIG_FILE), os.path.join(path, WEIGHTS_FILE)
        if not (os.path.exists(cfg_file) and os.path.exists(w_file)):
            raise FileNotFoundError(f"{path}: not an EAGLE draft directory (needs {CONFIG_FILE} and {WEIGHTS_FILE})")
        with open(cfg_file) as f:
            cfg = EagleConfig(**json.load(f))
        net = cls(cfg)
        net.load_state_dict({k: v.float() for k, v in load_file(w_file).items()})
        return net.eval()


class EagleServing:
    """The draft network prepared for serving: projections as models.layers.Linear."""

    def __init__(self, net: EagleNet, device: torch.device, use_blocks: bool):
        self.cfg = net.cfg
        q8 = lambda w: _q8(w) if use_blocks else w.detach().float()
        lin = lambda m, bias=None: Linear([q8(m.weight)], bias, torch.float32, device, use_blocks)
        self.fc = lin(net.fc, net.fc.bias.detach().float())
        self.qkv, self.o, self.gate_up, self.down = lin(net.qkv), lin(net.o), lin(net.gate_up), lin(net.down)
        self.attn_norm = net.attn_norm.detach().float().to(device)
        self.ffn_norm = net.ffn_norm.detach().float().to(device)
        self.layer = LayerWeights(self.attn_norm, self.ffn_norm, self.qkv, self.o, self.gate_up, self.down)
        self.fused = fused_layer_weights(self.layer, self.cfg.head_dim)

    @torch.inference_mode()
    def forward(self, embeds: torch.Tensor, features: torch.Tensor, positions: torch.Tensor, rotary: Rotary,
                meta: AttentionMetadata, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """embeds, features [T, hidden]; k_cache/v_cache [slots, kv_heads, D] -> predicted features [T, hidden]."""
        cfg = self.cfg
        H, Hkv, D, eps = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps
        x = self.fc(torch.cat([embeds, features], dim=-1))  # [T, hidden]
        cos, sin = rotary.tables(positions)
        if runs_fused(self.fused, x.shape[0], meta):
            # The layer in one C++ call (as the target's decode steps): a draft step is well under a
            # millisecond of arithmetic, and issuing its ~20 ops from Python cost more than that.
            x, delta = fused_decoder_layer(x, None, self.fused, eps, cos, sin, k_cache, v_cache, meta, D ** -0.5, H, Hkv, D)
        else:
            x, delta = decoder_layer(x, None, self.layer, cos, sin, paged(k_cache, v_cache, meta, D ** -0.5), eps, H, Hkv, D)
        return x + delta


def _q8(w: torch.Tensor) -> QuantizedWeight:
    import gguf
    arr = w.detach().float().cpu().numpy()
    return QuantizedWeight("Q8_0", gguf.quants.quantize(arr, gguf.GGMLQuantizationType.Q8_0), tuple(arr.shape))
