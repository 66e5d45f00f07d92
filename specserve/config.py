"""Engine configuration as dataclasses; the CLI's flags map onto these one to one. Stdlib only."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class ModelConfig:
    model: Optional[str] = None  # None: the embedded SmolLM2-135M-Instruct GGUF
    dtype: str = "auto"  # auto: float32 (with GGUF block kernels on CPU: fastest and exact)
    device: str = "cpu"
    # On CPU in float32, GGUF Q4_0/Q4_1/Q8_0 weights stay in their blocks and run through the block
    # kernels for small batches; False forces dense fp32 everywhere (same results, slower).
    block_kernels: bool = True
    num_threads: Optional[int] = None  # torch CPU threads; None: all cores

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda[:N], got {self.device!r}")

    def resolved_dtype(self) -> str:
        return "float32" if self.dtype == "auto" else self.dtype


@dataclass
class CacheConfig:
    block_size: int = 16  # tokens per KV block
    kv_cache_gib: float = 1.0  # memory for the paged KV cache
    num_blocks: Optional[int] = None  # overrides kv_cache_gib when set


@dataclass
class SchedulerConfig:
    max_num_seqs: int = 64  # sequences decoded together
    max_num_batched_tokens: int = 2048  # tokens per forward pass (prefill chunks + decodes)
    max_model_len: Optional[int] = None  # None: the model's context length


@dataclass
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
