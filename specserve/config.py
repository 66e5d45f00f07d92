"""Engine configuration as dataclasses. Stdlib only.

A field made with `option(...)` is also a command-line flag (cli/args.py generates it): its help text,
and where they differ from the field's, its flag name, argparse type and choices, are written here
once. Fields made without it are set from Python only (LLM(...)).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Union

from .loading.quants import QUANTIZE_TYPES
from .options import option
from .registry import ATTENTION, DRAFTERS, POLICIES, SHAPES

DTYPES = ("auto", "float32", "bfloat16", "float16")
ACTIVATIONS = ("fp32", "int8")  # what the GGUF block kernels dot the weights with
KV_CACHE_DTYPES = ("auto", "float16")  # what the paged KV cache stores keys and values as
# what a draft model's wider GGML weights may be re-encoded as (loading/quants.py)
DRAFT_QUANTS = ("none",) + tuple(t.lower() for t in QUANTIZE_TYPES)


@dataclass
class ModelConfig:
    model: Optional[str] = option(
        None, "a .gguf file, an HF directory, or a known model's name (specserve models; pulled on first use) "
              "(default: embedded SmolLM2-135M)", parse="model_path")
    # auto: float32 on CPU (with GGUF block kernels: fastest and exact), bfloat16 on CUDA
    dtype: str = option("auto", "auto: float32 on CPU, bfloat16 on CUDA", choices=DTYPES)
    device: str = option("cpu", "cpu or cuda[:N]")
    # On CPU in float32, GGUF Q4_0/Q4_1/Q8_0 weights stay in their blocks and run through the block
    # kernels for small batches; False forces dense fp32 everywhere (same results, slower).
    block_kernels: bool = True
    # int8: each row of a block kernel's input quantised per 32 values and dotted with VNNI (issue 37):
    # several times cheaper rows, output within the mode's own bits (not fp32's)
    activations: str = option("fp32", "the GGUF block kernels' activations: fp32 (exact; default) or int8 (8 bits per "
                                      "32 values, as llama.cpp; faster)", choices=ACTIVATIONS)
    # None: the model's own (GGUF tokenizer.chat_template, an HF directory's, else one built in for its architecture)
    chat_template: Optional[str] = option(
        None, "a Jinja chat template in place of the model's own: a file, or the template's text (as vLLM's "
              "--chat-template)")
    # None: all cores, governed by load (engine/threads.py)
    num_threads: Optional[int] = option(
        None, "pin the CPU threads (default: all cores, fewer while other processes compete)", flag="--threads",
        parse="positive_int")
    # On CUDA, decode and verify steps replay CUDA graphs (engine/graph_runner.py); False: every step eager.
    cuda_graphs: bool = option(
        True, "on CUDA, run every step eagerly (default: decode and verify steps replay CUDA graphs)",
        flag="--no-cuda-graphs")
    # With graphs, greedy decodes (EAGLE's too: draft, verify, accept) run up to this many rounds on the GPU
    # between host syncs (cuda/rounds.py); 0: one step per sync. Ignored on CPU.
    cuda_rounds: int = option(16, "on CUDA with graphs, run up to N greedy decode rounds (EAGLE: draft, verify and "
                                  "accept) on the GPU per host sync (default 16; 0: one step per sync)")
    # The target's projections and LM head by one fixed-tile kernel (cuda/linear.py): a row's result is
    # the same bits whatever the pass's other rows, so greedy speculation gives regular decoding's tokens
    # in bfloat16 too (cuBLAS tiles by row count). Needs triton; ignored on CPU.
    batch_invariant: bool = option(False, "on CUDA with graphs, the target's projections by one fixed-tile kernel: "
                                          "greedy speculation then gives regular decoding's tokens in bfloat16 too")

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.activations not in ACTIVATIONS:
            raise ValueError(f"activations must be one of {', '.join(ACTIVATIONS)}, got {self.activations!r}")
        if self.activations == "int8" and (self.device != "cpu" or self.dtype not in ("auto", "float32") or not self.block_kernels):
            raise ValueError("int8 activations are the CPU block kernels' mode: use them with --device cpu, "
                             "float32 and the block kernels on")
        if self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda[:N], got {self.device!r}")
        if self.num_threads is not None:
            _check_int("num_threads", self.num_threads, 1)
        if not isinstance(self.cuda_graphs, bool):
            raise ValueError(f"cuda_graphs must be True or False, got {self.cuda_graphs!r}")
        _check_int("cuda_rounds", self.cuda_rounds, 0)
        if not isinstance(self.batch_invariant, bool):
            raise ValueError(f"batch_invariant must be True or False, got {self.batch_invariant!r}")

    def resolved_dtype(self) -> str:
        """auto: bfloat16 on CUDA (GGUF weights dequantised at load; half the bytes a step reads),
        float32 on CPU; float32 stays the option for parity runs on CUDA."""
        if self.dtype != "auto":
            return self.dtype
        return "bfloat16" if self.device.startswith("cuda") else "float32"


@dataclass
class CacheConfig:
    block_size: int = 16  # tokens per KV block
    kv_cache_gib: float = option(1.0, "memory for the paged KV cache, allocated up front (default 1 GiB)",
                                 parse="positive_float")
    num_blocks: Optional[int] = None  # overrides kv_cache_gib when set
    # float16 (llama.cpp's default cache type, vLLM's --kv-cache-dtype): half the bytes a decode step
    # reads at long context and twice the tokens in kv_cache_gib; keys and values are rounded to f16
    # once, as they are written (a value past f16's 65504 would become inf, as in llama.cpp's f16
    # cache), and the attention still sums in f32 (kernels/attention.cpp)
    kv_cache_dtype: str = option("auto", "auto: the model's dtype (exact); float16: half the memory and the reads, "
                                         "keys and values rounded to f16 (CPU, float32 models)",
                                 choices=KV_CACHE_DTYPES)
    # reuse the KV of full blocks another request computed for the same tokens (kv/block_manager.py);
    # off with drafters that read the target's hidden states (EAGLE)
    enable_prefix_caching: bool = option(
        True, "compute every prompt in full (default: reuse the KV blocks of a prefix computed before)",
        flag="--no-prefix-caching")

    def __post_init__(self):
        _check_int("block_size", self.block_size, 1)
        if isinstance(self.kv_cache_gib, bool) or not isinstance(self.kv_cache_gib, (int, float)) \
                or not math.isfinite(self.kv_cache_gib) or self.kv_cache_gib <= 0:
            raise ValueError(f"kv_cache_gib must be a finite number of GiB > 0, got {self.kv_cache_gib!r}")
        if self.num_blocks is not None:
            _check_int("num_blocks", self.num_blocks, 1)
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")


@dataclass
class SchedulerConfig:
    max_num_seqs: int = option(64, "most sequences in one batch", parse="positive_int")
    max_num_batched_tokens: int = 2048  # tokens per forward pass (prefill chunks + decodes)
    max_model_len: Optional[int] = option(
        None, "the longest sequence (prompt + output) served, at most the model's context (default: the context)",
        parse="positive_int")
    # SARATHI: prompt tokens per step after the running decodes. "auto": measured on this machine when the
    # engine starts (speculative/calibration.py: the smallest chunk whose prefill rate is within 10% of
    # the best); an int: that many; None: whole prompts, up to max_num_batched_tokens a step.
    prefill_chunk: Union[int, str, None] = option(
        "auto", "prompt tokens per step beside the running decodes (SARATHI): auto (measured at start), a number, "
                "or none (whole prompts)", parse="prefill_chunk")

    def __post_init__(self):
        _check_int("max_num_seqs", self.max_num_seqs, 1)
        _check_int("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        if self.prefill_chunk != "auto" and self.prefill_chunk is not None:
            _check_int("prefill_chunk (or \"auto\", or None)", self.prefill_chunk, 1)
        if self.max_model_len is not None:
            _check_int("max_model_len", self.max_model_len, 2)


def _check_int(name: str, value, lowest: int, highest: Optional[int] = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < lowest:
        raise ValueError(f"{name} must be an integer >= {lowest}, got {value!r}")
    if highest is not None and value > highest:
        raise ValueError(f"{name} must be at most {highest}, got {value!r}")


@dataclass
class SpeculativeConfig:
    """Speculative decoding. LLM(speculative={...}) takes these fields as a dict; the CLI's flags are
    these fields (method: --speculative, with "none" for regular decoding: cli/engine_args.py)."""

    method: str = "draft"  # a name in registry.DRAFTERS
    # None: the draft shipped for the embedded model
    draft_model: Optional[str] = option(None, "an EAGLE draft dir or a model with the target's tokenizer",
                                        parse="model_path")
    draft_len: Union[str, int] = option("auto", "auto, or K: fixed k / BASS l0 / threshold limit")
    # FR-Spec (drafters/vocab.py): a standalone draft model's head over the N most frequent tokens only
    draft_vocab: int = option(0, "a draft model's LM head over the N most frequent tokens only (FR-Spec; 0: all)")
    # A draft pass reads every weight once (memory-bound on CPU): re-encoded in fewer bits it costs less.
    # Lossless whatever it does to the draft's acceptance: each draft token is verified by the target
    # (docs/decisions.md#draft-quant).
    draft_quant: str = option("none", "re-encode a GGUF draft model's block weights wider than this GGML type as it "
                                      "(its embedding excepted): fewer bytes a draft pass reads", choices=DRAFT_QUANTS)
    policy: str = option("bass", "draft-length policy", choices=POLICIES)
    # Ragged verification attention: "split" (per sequence) or "pad" (one padded batch). "auto": split
    # on CPU (the C++ paged kernel, no padding work), pad on CUDA (one kernel instead of one per
    # sequence); both chosen by the PAD/SPLIT ablation of `specserve bench spec` on each device.
    attention: str = option("auto", "ragged verification attention", choices=ATTENTION)
    fallback: bool = option(True, "let the cost model skip drafting where it would not pay (--no-fallback: always draft)")
    lookup_max_ngram: int = option(4, "the longest suffix n-gram prompt lookup matches")
    # the "ngram" method's Katz model (`specserve build-ngram`); None: one built from the standard
    # library for the target's tokenizer on first use, then cached
    ngram_model: Optional[str] = option(
        None, "the ngram method's model (specserve build-ngram; default: built from the stdlib, cached)",
        parse="model_path")
    # the "staged" method's levels, top down: each drafts for the one before it (the first for the
    # target). Model stages: "draft" (draft_model, a standalone model), "target" (the serving model
    # itself), or a model path; the last may also be "ngram" or "lookup" (drafters/staged.py).
    stages: tuple = option(("draft", "ngram"), "the staged method's levels, top down: draft (--draft-model), target, "
                                               "or a model path; the last may be ngram or lookup")
    # Token trees (drafters that make them: EAGLE and a standalone draft model): a name in registry.SHAPES, and the tree's
    # width (drafters.TreeShape): top-k children per expanded node, nodes expanded per level, nodes kept.
    # lookahead decoding (drafters/lookahead.py): the Jacobi window's width W, the n-gram size N (N - 1
    # levels of W guesses) and at most G pool n-grams verified per step
    lookahead_window: int = option(4, "the lookahead method's Jacobi window W")
    lookahead_ngram: int = option(3, "the lookahead method's n-gram size N (N - 1 levels of guesses)")
    lookahead_guesses: int = option(4, "the lookahead method's pool n-grams verified per step, G")
    shape: str = option("chain", "draft shape", choices=SHAPES)
    tree_top_k: int = option(4, "a tree's children per expanded node")
    tree_beam: int = option(4, "a tree's nodes expanded per level")
    tree_max_nodes: int = option(15, "a tree's nodes at most")

    def resolved_attention(self, device: str) -> str:
        if self.attention != "auto":
            return self.attention
        return "split" if device.startswith("cpu") else "pad"

    def __post_init__(self):
        DRAFTERS.check(self.method)
        POLICIES.check(self.policy)
        ATTENTION.check(self.attention)
        SHAPES.check(self.shape)
        for name in ("tree_top_k", "tree_beam", "tree_max_nodes"):
            _check_int(name, getattr(self, name), 1)
        _check_int("draft_vocab", self.draft_vocab, 0)
        if self.draft_quant not in DRAFT_QUANTS:
            raise ValueError(f"draft_quant must be one of {', '.join(DRAFT_QUANTS)}, got {self.draft_quant!r}")
        if self.draft_len != "auto":
            k = self.draft_len
            if isinstance(k, str) and k.strip().lstrip("-").isdigit():
                k = int(k)
            if not isinstance(k, int) or isinstance(k, bool) or k < 1:
                raise ValueError(f"draft_len must be 'auto' or an integer >= 1, got {self.draft_len!r}")
            self.draft_len = k
        _check_int("lookup_max_ngram", self.lookup_max_ngram, 1)
        # bounds that keep the lookahead tree inside the verifier's (speculative/verify.py: depth 32, width 16)
        _check_int("lookahead_window", self.lookahead_window, 1, 16)
        _check_int("lookahead_ngram", self.lookahead_ngram, 2, 8)
        _check_int("lookahead_guesses", self.lookahead_guesses, 0, 14)
        if isinstance(self.stages, str):
            self.stages = tuple(s.strip() for s in self.stages.split(","))
        if not isinstance(self.stages, (list, tuple)) or len(self.stages) < 2 or \
                not all(isinstance(s, str) and s for s in self.stages):
            raise ValueError(f"stages must list at least two stages, top down (e.g. ['draft', 'ngram']), got {self.stages!r}")
        self.stages = tuple(self.stages)
        if not isinstance(self.fallback, bool):
            raise ValueError(f"fallback must be True or False, got {self.fallback!r}")

    @classmethod
    def from_any(cls, spec) -> Optional["SpeculativeConfig"]:
        if spec is None or isinstance(spec, cls):
            return spec
        if isinstance(spec, str):
            return cls(method=spec)
        if isinstance(spec, dict):
            unknown = set(spec) - {f for f in cls.__dataclass_fields__}
            if unknown:
                raise ValueError(f"unknown speculative option(s) {', '.join(sorted(unknown))} "
                                 f"(known: {', '.join(cls.__dataclass_fields__)})")
            return cls(**spec)
        raise ValueError(f"speculative must be None, a method name or a dict, got {type(spec).__name__}")


@dataclass
class GuidedConfig:
    """Guided generation (SamplingParams.guided_*)."""

    # append the tokens a grammar forces without sampling them, computed in the next pass as a prefill
    # chunk (the same tokens sampling would give: their constrained probability is 1)
    fast_forward: bool = option(
        True, "sample the tokens a grammar forces instead of appending them (same output, slower)",
        flag="--no-fast-forward")

    def __post_init__(self):
        if not isinstance(self.fast_forward, bool):
            raise ValueError(f"guided_fast_forward must be True or False, got {self.fast_forward!r}")


@dataclass
class LoadConfig:
    """Checks of a model before it is trusted (loading/validate.py).
    Always: the header's hyper-parameters in range and consistent with the tensor table and the file."""

    check_tensors: bool = option(  # llama.cpp's --check-tensors
        False, "read every tensor for NaN/Inf block scales and values before serving (as llama.cpp's)")
    check_memory: bool = option(  # checked before anything is allocated
        True, "refuse a model whose weights + KV cache exceed the memory available (default: on)")

    def __post_init__(self):
        for name in ("check_tensors", "check_memory"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")


@dataclass
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    load: LoadConfig = field(default_factory=LoadConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    speculative: Optional[SpeculativeConfig] = None
    guided: GuidedConfig = field(default_factory=GuidedConfig)
