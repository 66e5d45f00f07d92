"""Building the n-gram model a drafter uses: from the Python standard library's source (offline, as
the staged-decoding paper's second stage was built from text it had at hand) and any token files
given (e.g. the target's own generations written by `specserve train-draft`), for one tokenizer."""
from __future__ import annotations

import os
import sys
import time
from typing import Callable, Optional

import numpy as np

from ..ngram.katz import KatzModel
from .corpus import build_corpus


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr)  # stdout carries the generated text (`specserve generate`)


def build_ngram(tokenizer, corpus_tokens: int = 0, token_files: tuple[str, ...] = (), progress=None,
                log: Callable[[str], None] = _to_stderr) -> KatzModel:
    """A Katz trigram model over the stdlib's tokens (corpus_tokens: 0 = all) plus the token files
    (.npy of token ids, documents separated by EOS; corpus_tokens < 0: no stdlib), tagged with the
    tokenizer's fingerprint."""
    t0 = time.perf_counter()
    parts = [build_corpus(tokenizer, corpus_tokens, progress=progress)] if corpus_tokens >= 0 else []
    for path in token_files:
        ids = np.load(path)
        if ids.ndim != 1 or ids.size and int(ids.max()) >= tokenizer.vocab_size:
            raise ValueError(f"{path}: expected a 1-D array of token ids below {tokenizer.vocab_size}")
        parts.append(ids)
    ids = np.concatenate(parts).astype(np.int64)
    eos = tokenizer.eos_token_ids[0] if tokenizer.eos_token_ids else None
    model = KatzModel.build(ids, tokenizer.vocab_size, separator=eos)
    model.meta["tokenizer_sha256"] = tokenizer.fingerprint()
    model.meta["sources"] = ["stdlib"] * (corpus_tokens >= 0) + [os.path.basename(p) for p in token_files]
    log(f"n-gram model: {model.meta['tokens']:,} tokens, {model.meta['bigrams']:,} bigrams, "
        f"{model.meta['trigrams']:,} trigrams ({time.perf_counter() - t0:.1f} s)")
    return model


def load_for(path: str, tokenizer) -> KatzModel:
    """Load an n-gram model, refusing one built for another tokenizer (its ids would mean other tokens)."""
    model = KatzModel.load(path)
    want, got = tokenizer.fingerprint(), model.meta.get("tokenizer_sha256")
    if got != want:
        raise ValueError(f"{path} was built for another tokenizer; rebuild it for this model with "
                         f"`specserve build-ngram --model <target> --out {path}`")
    return model


def default_path(cache_dir: Optional[str], tokenizer) -> Optional[str]:
    """Where the default model (the whole stdlib) for this tokenizer is cached."""
    return os.path.join(cache_dir, f"ngram-{tokenizer.fingerprint()[:16]}-stdlib.npz") if cache_dir else None
