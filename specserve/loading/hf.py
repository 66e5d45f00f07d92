"""Hugging Face model directories (config.json, *.safetensors, tokenizer.json) -> canonical weights."""
from __future__ import annotations

import glob
import json
import os
import re

from safetensors import safe_open

from ..registry import ARCHITECTURES, architecture_for_hf_class
from .tokenizer import Tokenizer
from .weights import ModelArch

_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm",
    "post_attention_layernorm.weight": "ffn_norm",
    "self_attn.q_proj.weight": "q",
    "self_attn.k_proj.weight": "k",
    "self_attn.v_proj.weight": "v",
    "self_attn.o_proj.weight": "o",
    "self_attn.q_proj.bias": "q_bias",
    "self_attn.k_proj.bias": "k_bias",
    "self_attn.v_proj.bias": "v_bias",
    "mlp.gate_proj.weight": "gate",
    "mlp.up_proj.weight": "up",
    "mlp.down_proj.weight": "down",
}
_GLOBAL_NAMES = {"model.embed_tokens.weight": "embed", "model.norm.weight": "norm", "lm_head.weight": "lm_head"}


def arch_from_config(cfg: dict, path: str) -> ModelArch:
    archs = cfg.get("architectures") or []
    arch = next((architecture_for_hf_class(a) for a in archs if architecture_for_hf_class(a)), None)
    if arch is None:
        supported = ", ".join(ARCHITECTURES.get(n).hf_class for n in ARCHITECTURES.names())
        raise ValueError(f"{path}: architecture {archs or cfg.get('model_type')!r} is not supported "
                         f"(supported: {supported})")
    n_heads = cfg["num_attention_heads"]
    rope_scaling = cfg.get("rope_scaling")
    rope_theta = cfg.get("rope_theta", 10000.0)
    params = cfg.get("rope_parameters")  # transformers >= 5 keeps rope settings here
    if params:
        rope_theta = params.get("rope_theta", rope_theta)
        if params.get("rope_type", "default") != "default":
            rope_scaling = params
    if rope_scaling and rope_scaling.get("rope_type", rope_scaling.get("type")) not in ("llama3", "default"):
        raise ValueError(f"{path}: rope scaling {rope_scaling!r} is not supported (supported: llama3)")
    eos = cfg.get("eos_token_id")
    eos = eos if isinstance(eos, list) else ([eos] if eos is not None else [])
    return ModelArch(
        architecture=arch,
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=cfg["num_hidden_layers"],
        num_attention_heads=n_heads,
        num_key_value_heads=cfg.get("num_key_value_heads") or n_heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // n_heads,
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling if rope_scaling and rope_scaling.get("rope_type", rope_scaling.get("type")) == "llama3" else None,
        max_position_embeddings=cfg.get("max_position_embeddings", 4096),
        tie_word_embeddings=cfg.get("tie_word_embeddings", False),
        attention_bias=ARCHITECTURES.get(arch).attention_bias or cfg.get("attention_bias", False),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=eos,
        # Mistral attends to a sliding window on every layer (Qwen2's configs name one but do not use it)
        sliding_window=cfg.get("sliding_window") if arch == "mistral" else None,
    )


def load_hf_dir(path: str, with_tokenizer: bool = True):
    cfg_file = os.path.join(path, "config.json")
    if not os.path.exists(cfg_file):
        raise ValueError(f"{path}: no config.json (expected a Hugging Face model directory or a .gguf file)")
    try:
        with open(cfg_file) as fh:
            arch = arch_from_config(json.load(fh), path)
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg_file}: not valid JSON ({e})") from None
    except KeyError as e:
        raise ValueError(f"{cfg_file}: the key {e} is missing (a Llama-family config needs it)") from None
    except (TypeError, AttributeError) as e:
        raise ValueError(f"{cfg_file}: a value has the wrong type ({e})") from None
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise ValueError(f"{path}: no *.safetensors weights (only safetensors checkpoints are supported)")
    layer_re = re.compile(r"model\.layers\.(\d+)\.(.+)")
    weights = {}
    for f in files:
        try:
            with safe_open(f, framework="pt") as st:
                for key in st.keys():
                    m = layer_re.fullmatch(key)
                    if m and m.group(2) in _LAYER_NAMES:
                        name = f"layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
                    elif key in _GLOBAL_NAMES:
                        name = _GLOBAL_NAMES[key]
                    else:
                        continue
                    weights[name] = st.get_tensor(key).float()
        except Exception as e:  # safetensors' own error types: a truncated or corrupt file
            if isinstance(e, (KeyboardInterrupt, MemoryError)):
                raise
            raise ValueError(f"{f}: cannot read this safetensors file ({str(e).splitlines()[0][:200]})") from None
    missing = [n for n in _required_names(arch) if n not in weights]
    if missing:
        raise ValueError(f"{path}: {len(missing)} tensors missing from the checkpoint, e.g. {', '.join(missing[:3])}")
    if "lm_head" in weights and arch.tie_word_embeddings:
        del weights["lm_head"]
    if "lm_head" not in weights:
        arch.tie_word_embeddings = True
    tokenizer = Tokenizer.from_hf_dir(path, arch.eos_token_ids, arch.bos_token_id) if with_tokenizer else None
    return arch, weights, tokenizer


def _required_names(arch: ModelArch) -> list[str]:
    """Canonical names a Llama-family checkpoint must carry (lm_head is optional: tied)."""
    per_layer = ["attn_norm", "ffn_norm", "q", "k", "v", "o", "gate", "up", "down"]
    if arch.attention_bias:
        per_layer += ["q_bias", "k_bias", "v_bias"]
    return ["embed", "norm"] + [f"layers.{i}.{n}" for i in range(arch.num_hidden_layers) for n in per_layer]
