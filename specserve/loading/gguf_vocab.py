"""A GGUF vocabulary as a `tokenizers` backend, and the ids that end a generation.

GGUF files bring one of two vocabularies (`tokenizer.ggml.model`):
  * "gpt2": byte-level BPE with its merges (Qwen2, Llama 3, SmolLM);
  * "llama": SentencePiece BPE (Llama 2, Mistral, Gemma): no merges, a score per piece; text is
    spelled with U+2581 for spaces and unknown characters fall back to <0xNN> byte pieces.
"""
from __future__ import annotations

import hashlib
import os
from array import array
from typing import Optional

import numpy as np
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from .infill import FimTokens

# Pre-tokenizer regexes by GGUF `tokenizer.ggml.pre` (as in llama.cpp's llama-vocab.cpp).
_LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
_SPACE = "\u2581"  # SentencePiece's spelling of a space


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


# Control tokens that end a generation whatever the header's eos id (llama.cpp's list): turn ends, and
# the end of a document (Qwen2.5-Coder ends a fill-in-the-middle answer with <|endoftext|>).
END_OF_GENERATION = ("<|eot_id|>", "<|im_end|>", "<end_of_turn>", "<|end|>", "<EOT>", "<|END_OF_TURN_TOKEN|>",
                     "<|endoftext|>", "<|eom_id|>", "<|end_of_text|>")


def _byte_level_bpe(fields: dict, tokens: list[str]) -> HFTokenizer:
    merges = [tuple(m.split(" ", 1)) for m in fields.get("tokenizer.ggml.merges") or []]
    vocab = {t: i for i, t in enumerate(tokens)}
    backend = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    backend.pre_tokenizer = _byte_level_pre_tokenizer(fields.get("tokenizer.ggml.pre", "default"))
    backend.decoder = decoders.ByteLevel()
    return backend


def _merge_order(tokens: list[str], spelled: list[str], vocab: dict, types: list[int], scores) -> tuple[list, list]:
    """_sentencepiece_bpe's merges as (left ids, right ids), highest-ranked first."""
    # Gemma: 513k merges. Kept as compact arrays and sorted by numpy (tuples of strings took ~200 MB).
    later, neg_score, left_ids, right_ids = array("b"), array("d"), array("l"), array("l")
    for i, (piece, ty) in enumerate(zip(spelled, types)):
        # the respelled runs of spaces merge before anything else: llama.cpp matches them whole first
        run = ty == TOKEN_TYPE_USER_DEFINED and piece != tokens[i]
        if len(piece) < 2 or not (ty == TOKEN_TYPE_NORMAL or run):
            continue
        for k in range(1, len(piece)):
            left = vocab.get(piece[:k])
            right = vocab.get(piece[k:]) if left is not None else None
            if right is not None:
                later.append(not run)
                neg_score.append(-scores[i])
                left_ids.append(left)
                right_ids.append(right)
    order = np.lexsort((right_ids, left_ids, neg_score, later))  # the last key sorts first
    return np.asarray(left_ids)[order].tolist(), np.asarray(right_ids)[order].tolist()


# Bump when _merge_order's result changes: the cached orders of older versions are then not read.
_MERGE_ORDER_VERSION = b"spm-merge-order-v1"


def _cached_merge_order(tokens: list[str], types: list[int], scores, build) -> tuple[list, list]:
    """build()'s merge order, kept in cache_dir()/tokenizers under a hash of the vocabulary, its types
    and scores: rebuilding Gemma's 513k merges took 1.1 s of every load, reading them back ~0.05 s."""
    from .paths import cache_dir
    root = cache_dir()
    if not root:
        return build()
    h = hashlib.sha256(_MERGE_ORDER_VERSION)
    h.update("\0".join(tokens).encode("utf-8", "surrogatepass"))
    h.update(np.asarray(types, dtype=np.int64).tobytes())
    h.update(np.asarray(scores, dtype=np.float64).tobytes())
    path = os.path.join(root, "tokenizers", f"spm-merges-{h.hexdigest()[:24]}.npy")
    try:
        cached = np.load(path)
        if cached.ndim == 2 and cached.shape[0] == 2 and cached.size and int(cached.max()) < len(tokens) \
                and int(cached.min()) >= 0:
            return cached[0].tolist(), cached[1].tolist()
    except (OSError, ValueError):  # none yet, or unreadable: built again (and rewritten)
        pass
    lefts, rights = build()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            np.save(f, np.array([lefts, rights], dtype=np.int32))
        os.replace(tmp, path)  # whole or not at all: a load beside this one never reads half a file
    except OSError:  # a read-only cache: build every time, as before
        pass
    return lefts, rights


def _sentencepiece_bpe(fields: dict, tokens: list[str], types: list[int], path: str) -> HFTokenizer:
    """SentencePiece BPE as llama.cpp's SPM tokenizer runs it: the adjacent pair whose merged piece has
    the highest score merges first. `tokenizers`' BPE merges by rank instead, so the merges are rebuilt
    from the vocabulary: every split of a normal piece into two pieces of the vocabulary, ranked by the
    merged piece's score (ties: the pieces' ids, as transformers' GGUF loader orders them).
    Gemma spells its user-defined runs of spaces with real spaces ("  "); inside the model they are
    looked up as U+2581 runs, so they are respelled (transformers does the same)."""
    scores = fields.get("tokenizer.ggml.scores")
    if scores is None or len(scores) != len(tokens):
        raise ValueError(f"{path}: a SentencePiece vocabulary needs a score per token (tokenizer.ggml.scores)")
    spelled = [_SPACE * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {t: i for i, t in enumerate(spelled)}
    lefts, rights = _cached_merge_order(tokens, types, scores, lambda: _merge_order(tokens, spelled, vocab, types, scores))
    unk = fields.get("tokenizer.ggml.unknown_token_id")
    bpe = models.BPE(vocab=vocab, merges=[(spelled[a], spelled[b]) for a, b in zip(lefts, rights)], fuse_unk=True,
                     byte_fallback=True, unk_token=tokens[unk] if unk is not None else None)
    backend = HFTokenizer(bpe)
    # A leading space (Llama 2, Mistral; not Gemma) is prepended to the text, as SentencePiece's
    # add_dummy_prefix does, and stripped again when decoding.
    prefix = bool(fields.get("tokenizer.ggml.add_space_prefix", True))
    backend.normalizer = normalizers.Sequence(([normalizers.Prepend(_SPACE)] if prefix else [])
                                              + [normalizers.Replace(" ", _SPACE)])
    backend.decoder = decoders.Sequence([decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
                                        + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return backend


def backend(fields: dict, tokens: list[str], types: list[int], path: str) -> HFTokenizer:
    """The GGUF vocabulary as a `tokenizers` backend, its control and user-defined tokens added."""
    if fields.get("tokenizer.ggml.model") == "gpt2":
        out = _byte_level_bpe(fields, tokens)
        # Control tokens (<|im_end|>) are special, dropped from decoded text; user-defined ones
        # (Qwen's <tool_call>) are matched whole but kept in the text, as HF (they are its added
        # tokens that are not special) and llama.cpp print them: a tool-call parser reads them.
        user = [t for t, ty in zip(tokens, types) if ty == TOKEN_TYPE_USER_DEFINED]
    else:
        out = _sentencepiece_bpe(fields, tokens, types, path)
        # Control tokens (<bos>, <start_of_turn>) are special; user-defined ones (Gemma's runs of
        # newlines, "\t") are matched whole in the text, as llama.cpp does. Runs of spaces are
        # left to the merges (their pieces are spelled with U+2581, see _sentencepiece_bpe).
        user = [t for t, ty in zip(tokens, types) if ty == TOKEN_TYPE_USER_DEFINED and " " not in t]
    out.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == TOKEN_TYPE_CONTROL])
    out.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])
    return out


def end_of_generation(tokens: list[str], types: list[int], named: tuple[Optional[int], ...],
                      fim: FimTokens) -> list[int]:
    """The ids a generation stops on, as llama.cpp's llama_vocab_is_eog: the header's EOS and EOT
    (`named`), then the control tokens of END_OF_GENERATION by their text (a chat model's turn end the
    header may not name, as Gemma's <end_of_turn>) and a code model's fill-in-the-middle ends."""
    out = [i for i in named if i is not None]
    fim_ends = set(fim.ends())
    out += [i for i, (t, ty) in enumerate(zip(tokens, types))
            if ((ty == TOKEN_TYPE_CONTROL and t in END_OF_GENERATION) or i in fim_ends) and i not in out]
    return out
