"""Tokenizer: a `tokenizers.Tokenizer` plus the chat template and the special ids the engine needs.

Built either from GGUF metadata (BPE / "gpt2" vocabularies) or from a Hugging Face tokenizer.json.
"""
from __future__ import annotations

import json
import os
from typing import Optional, Sequence

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

# Pre-tokenizer regexes by GGUF `tokenizer.ggml.pre` (as in llama.cpp's llama-vocab.cpp).
_GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_TOKEN_TYPE_CONTROL = 3
_TOKEN_TYPE_USER_DEFINED = 4


def _byte_level_pre_tokenizer(pre: str):
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    if pre in ("llama-bpe", "llama3", "smaug-bpe", "dbrx"):
        split = pre_tokenizers.Split(Regex(_LLAMA3_REGEX), behavior="isolated")
        return pre_tokenizers.Sequence([split, byte_level])
    if pre in ("qwen2", "deepseek-r1-qwen"):
        split = pre_tokenizers.Split(Regex(_QWEN2_REGEX), behavior="isolated")
        return pre_tokenizers.Sequence([split, byte_level])
    if pre == "smollm":
        # SmolLM: every digit is its own token, then the GPT-2 split.
        return pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


class Tokenizer:
    def __init__(self, backend: HFTokenizer, eos_token_ids: Sequence[int], bos_token_id: Optional[int],
                 add_bos: bool, chat_template: Optional[str], special_tokens: dict[str, str]):
        self.backend = backend
        self.eos_token_ids = list(eos_token_ids)
        self.bos_token_id = bos_token_id
        self.add_bos = add_bos
        self.chat_template = chat_template
        self.special_tokens = special_tokens  # e.g. {"bos_token": "<|im_start|>", "eos_token": ...}
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)

    # --- construction -------------------------------------------------------------------------
    @classmethod
    def from_gguf_fields(cls, fields: dict, path: str) -> "Tokenizer":
        kind = fields.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(f"{path}: tokenizer type {kind!r} is not supported (supported: 'gpt2' BPE)")
        tokens: list[str] = fields["tokenizer.ggml.tokens"]
        merges = [tuple(m.split(" ", 1)) for m in fields.get("tokenizer.ggml.merges") or []]
        vocab = {t: i for i, t in enumerate(tokens)}
        bpe = models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False)
        backend = HFTokenizer(bpe)
        backend.pre_tokenizer = _byte_level_pre_tokenizer(fields.get("tokenizer.ggml.pre", "default"))
        backend.decoder = decoders.ByteLevel()
        types = fields.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        specials = [AddedToken(t, special=True, normalized=False)
                    for t, ty in zip(tokens, types) if ty in (_TOKEN_TYPE_CONTROL, _TOKEN_TYPE_USER_DEFINED)]
        backend.add_special_tokens(specials)
        eos = fields.get("tokenizer.ggml.eos_token_id")
        eot = fields.get("tokenizer.ggml.eot_token_id")
        eos_ids = [i for i in (eos, eot) if i is not None]
        bos = fields.get("tokenizer.ggml.bos_token_id")
        add_bos = bool(fields.get("tokenizer.ggml.add_bos_token", False))
        special = {}
        if bos is not None:
            special["bos_token"] = tokens[bos]
        if eos is not None:
            special["eos_token"] = tokens[eos]
        return cls(backend, eos_ids, bos, add_bos, fields.get("tokenizer.chat_template"), special)

    @classmethod
    def from_hf_dir(cls, path: str, eos_token_ids: Sequence[int], bos_token_id: Optional[int]) -> "Tokenizer":
        tok_file = os.path.join(path, "tokenizer.json")
        if not os.path.exists(tok_file):
            raise ValueError(f"{path}: no tokenizer.json (a Hugging Face directory needs one)")
        backend = HFTokenizer.from_file(tok_file)
        cfg_file = os.path.join(path, "tokenizer_config.json")
        cfg = json.load(open(cfg_file)) if os.path.exists(cfg_file) else {}

        def token_str(v):
            return v.get("content") if isinstance(v, dict) else v

        special = {k: token_str(cfg[k]) for k in ("bos_token", "eos_token") if cfg.get(k)}
        eos_ids = list(eos_token_ids)
        if "eos_token" in special and backend.token_to_id(special["eos_token"]) is not None:
            eid = backend.token_to_id(special["eos_token"])
            if eid not in eos_ids:
                eos_ids.append(eid)
        if bos_token_id is None and "bos_token" in special:
            bos_token_id = backend.token_to_id(special["bos_token"])
        # A tokenizer.json whose post-processor adds BOS already does it in encode().
        add_bos = bool(cfg.get("add_bos_token", False)) and backend.post_processor is None
        template = cfg.get("chat_template")
        if isinstance(template, list):  # named templates: take the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        return cls(backend, eos_ids, bos_token_id, add_bos, template, special)

    def fingerprint(self) -> str:
        """SHA-256 of the vocabulary (token -> id): two tokenizers with the same fingerprint agree on ids."""
        import hashlib
        vocab = sorted(self.backend.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
        return hashlib.sha256("\n".join(f"{i}\t{t}" for t, i in vocab).encode()).hexdigest()

    # --- use ----------------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # encode_batch of one: the same ids, but it lets go of the GIL while it works (encode holds it,
        # ~2.5 s for 4 MB of text), so a server tokenising in a thread keeps answering meanwhile
        ids = self.backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        if add_special_tokens and self.add_bos and self.bos_token_id is not None:
            if not ids or ids[0] != self.bos_token_id:
                ids = [self.bos_token_id] + ids
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if not self.chat_template:
            raise ValueError("this model has no chat template; use generate() with a plain prompt")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, undefined=jinja2.Undefined)

        def raise_exception(msg):
            raise jinja2.exceptions.TemplateError(msg)

        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, **self.special_tokens)


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas without re-decoding everything.

    Decodes a short window (the last few tokens) and holds back text that ends in an incomplete
    UTF-8 sequence, as vLLM's detokenizer does.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.prefix_offset = 0  # window start
        self.read_offset = 0  # tokens whose text has been emitted

    def step(self, ids: Sequence[int]) -> str:
        prefix = self.tokenizer.decode(ids[self.prefix_offset:self.read_offset], self.skip)
        full = self.tokenizer.decode(ids[self.prefix_offset:], self.skip)
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            delta = full[len(prefix):]
            self.prefix_offset = self.read_offset
            self.read_offset = len(ids)
            return delta
        return ""
