"""specserve: a fast, lossless LLM inference engine."""
from .types import CompletionOutput, RequestOutput, SamplingParams

__version__ = "0.1.0"


def __getattr__(name):
    # LLM pulls in torch; keep `import specserve` light for the plain-Python parts.
    if name == "LLM":
        from .engine.llm import LLM
        return LLM
    raise AttributeError(name)


__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]
