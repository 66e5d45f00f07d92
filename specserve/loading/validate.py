"""A model file checked before it is trusted: its header's hyper-parameters in range and consistent with
its tensor table (before any of them sizes a loop or an allocation), the memory the engine will take
against what the machine has (before anything is allocated), and optionally (LoadConfig.check_tensors,
llama.cpp's --check-tensors) every tensor's scales and values for NaN/Inf. Each failure is one
ValueError naming the file and what is wrong.

The tensors' shapes against the hyper-parameters and their bytes against the file's size are checked
where the file is read (gguf_file.py, gguf.py)."""
from __future__ import annotations

import math
import os
import resource
from typing import Optional

import numpy as np
import torch

from .weights import ModelArch, QuantizedWeight

MAX_DIM = 1 << 20  # a hidden size, FFN width or head count beyond this is a corrupted header
MAX_CONTEXT = 1 << 24  # positions (16M; the largest published contexts are 10M)


def check_gguf_fields(fields: dict, path: str, num_tensors: int) -> None:
    """The hyper-parameters a GGUF header gives for `general.architecture`: integers in range, heads
    that divide, and no more blocks than the tensor table can hold (a block_count of 10^12 must not
    size a loop)."""
    from ..registry import ARCHITECTURES
    arch = fields.get("general.architecture")
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        return  # the architecture check names it
    p = arch + "."

    def integer(key: str, lowest: int, highest: int, required: bool = False) -> Optional[int]:
        v = fields.get(p + key)
        if v is None:
            if required:
                raise ValueError(f"{path}: the header lacks {p + key}")
            return None
        if isinstance(v, bool) or not isinstance(v, int) or not lowest <= v <= highest:
            raise ValueError(f"{path}: {p + key} is {_short(v)}, outside [{lowest}, {highest}]: a corrupted header")
        return v

    integer("block_count", 1, max(1, num_tensors), required=True)  # (gguf.py names a moderate excess's missing tensors)
    integer("embedding_length", 1, MAX_DIM, required=True)
    integer("feed_forward_length", 1, MAX_DIM * 4, required=True)
    heads = integer("attention.head_count", 1, MAX_DIM, required=True)
    kv_heads = integer("attention.head_count_kv", 1, heads)
    integer("attention.key_length", 1, MAX_DIM)
    integer("context_length", 1, MAX_CONTEXT)
    integer("vocab_size", 1, 1 << 24)
    if kv_heads is not None and heads % kv_heads:
        raise ValueError(f"{path}: {heads} attention heads cannot share {kv_heads} KV heads (not a divisor)")
    for key in ("attention.layer_norm_rms_epsilon", "rope.freq_base"):
        v = fields.get(p + key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0):
            raise ValueError(f"{path}: {p + key} is {_short(v)}, not a finite number > 0: a corrupted header")
    tokens = fields.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise ValueError(f"{path}: tokenizer.ggml.tokens is missing or not a list of strings: a corrupted header")


def _short(v) -> str:
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


# --- memory ------------------------------------------------------------------------------------------
def weight_bytes(weights: dict, dtype: torch.dtype, blocks: bool) -> int:
    """What the weights will hold resident once built (models/layers.Linear): GGML blocks read in place
    cost their file bytes; Q4_0 / Q4_1 blocks are also regrouped and kept dense for prefill-sized
    products; everything else is dense in `dtype`."""
    from ..models.layers import LEGACY_BLOCK_TYPES
    size = torch.finfo(dtype).bits // 8
    total = 0
    for w in weights.values():
        if not isinstance(w, QuantizedWeight):
            total += w.numel() * size
        elif not blocks:
            total += math.prod(w.shape) * size
        elif w.type_name in LEGACY_BLOCK_TYPES:
            total += 2 * w.raw.nbytes + math.prod(w.shape) * size
        else:
            total += w.raw.nbytes
    return total


def available_bytes() -> Optional[int]:
    """What this process may still take: the machine's MemAvailable, within a cgroup's memory.max and
    an address-space rlimit where those are set (a container's OOM killer and `ulimit -v` act on
    them, not on the machine's total). None where none is known (not Linux)."""
    limits = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    limits.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            cap = f.read().strip()
        if cap != "max":
            with open("/sys/fs/cgroup/memory.current") as f:
                limits.append(int(cap) - int(f.read()))
    except (OSError, ValueError):
        pass
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        try:
            with open("/proc/self/statm") as f:
                used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            limits.append(soft - used)
        except (OSError, ValueError):
            pass
    return min(limits) if limits else None


def check_memory(path: str, arch: ModelArch, weights: dict, dtype: torch.dtype, blocks: bool, kv_bytes: int,
                 max_len: int) -> None:
    """Refuse, in one line, a model whose weights, KV cache and position tables would not fit in what
    the machine has available, before any of it is allocated."""
    have = available_bytes()
    if have is None:
        return
    w = weight_bytes(weights, dtype, blocks)
    rotary = 4 * max_len * arch.head_dim * 4  # cos and sin tables, float32, and their construction
    need = w + kv_bytes + rotary
    if need > have:
        gib = lambda n: f"{n / 2**30:.1f} GiB"  # noqa: E731
        raise ValueError(f"{path}: needs about {gib(need)} (weights {gib(w)}, KV cache {gib(kv_bytes)}, position tables "
                         f"{gib(rotary)} for {max_len} positions) but {gib(max(have, 0))} is available; lower "
                         "--kv-cache-gib (or max_model_len), or pass --no-check-memory")


def validate_loaded(path: str, arch: ModelArch, weights: dict, config, dtype: torch.dtype, kv_bytes: int,
                    max_len: int) -> None:
    """The checks LoadConfig asks for on a loaded model (config: EngineConfig), before it is built."""
    mc = config.model
    if config.load.check_memory and mc.device == "cpu":  # (CUDA memory is the device's, checked by CUDA)
        check_memory(path, arch, weights, dtype, mc.block_kernels and dtype == torch.float32, kv_bytes, max_len)
    if config.load.check_tensors:
        check_tensors(path, weights)


# --- NaN / Inf -------------------------------------------------------------------------------------------
# Where each GGML block type keeps its fp16 scales (byte offsets within the block), as ggml's
# ggml_validate_row_data checks them: the quantized values themselves are small integers.
SCALE_OFFSETS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q4_K": (0, 2),
                 "Q6_K": (208,)}


def first_bad(w) -> Optional[str]:
    """What is wrong with one weight ("NaN or Inf block scale", "NaN or Inf value"), or None."""
    if isinstance(w, QuantizedWeight):
        if w.type_name not in SCALE_OFFSETS:
            return None if bool(np.isfinite(w.dequantize().numpy()).all()) else "NaN or Inf value"
        from .quants import BLOCK_LAYOUT
        blocks = w.raw.reshape(-1, BLOCK_LAYOUT[w.type_name][1])
        for at in SCALE_OFFSETS[w.type_name]:
            scales = np.ascontiguousarray(blocks[:, at:at + 2]).view(np.float16)
            if not np.isfinite(scales).all():
                return "NaN or Inf block scale"
        return None
    return None if bool(torch.isfinite(w).all()) else "NaN or Inf value"


def check_tensors(path: str, weights: dict) -> None:
    """The first weight with a NaN or Inf scale or value, in one line (every tensor is read: the whole
    file passes through memory once)."""
    for name, w in weights.items():
        bad = first_bad(w)
        if bad is not None:
            raise ValueError(f"{path}: tensor {name} has a {bad} (--check-tensors): a corrupted file")
