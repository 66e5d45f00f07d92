"""Model registry: architecture name -> implementation."""
from .llama import LlamaModel

MODEL_REGISTRY = {"llama": LlamaModel, "mistral": LlamaModel, "qwen2": LlamaModel}


def build_model(arch, weights, dtype, device, use_blocks=True, max_len=None):
    cls = MODEL_REGISTRY.get(arch.architecture)
    if cls is None:
        raise ValueError(f"architecture {arch.architecture!r} is not supported (supported: {', '.join(MODEL_REGISTRY)})")
    return cls(arch, weights, dtype, device, use_blocks=use_blocks, max_len=max_len)


__all__ = ["LlamaModel", "MODEL_REGISTRY", "build_model"]
