"""A draft model's reduced vocabulary (FR-Spec, Zhao et al. 2025): its LM head computes logits over the
most frequent tokens only. The head of a small model with a large vocabulary is a large share of its
pass: Qwen2.5-Coder-0.5B's Q8_0 head over 151,936 tokens is 29% of the file and a third of its int8
decode step. Drafting stays lossless: a draft token is verified against the target as any other, and
a sampled draft's q is the distribution it was drawn from (zero outside the reduced set), which is
all rejection sampling needs. What the set costs is acceptance: a target token outside it can only
be the target's own (bench/pair_spec.py reports the share of the target's outputs inside it).

The frequencies are counted on the Python standard library's source (code, docstrings and comments,
as the n-gram drafter's corpus), tokenised with the target's tokenizer; every added token (control
tokens such as <|im_end|>, EOS) is kept whatever its count. Tokens the stdlib never uses (31,610 of
Qwen2.5's 151,936 appear in it: not "```", not most of the words of prose answers) follow by id, which
for a BPE vocabulary is merge order, itself a frequency ranking of the tokenizer's training text
(docs/decisions.md#fr-spec: the share of the target's answers each size covers)."""
from __future__ import annotations

import os
from typing import Optional

import numpy as np
import torch


def frequent_vocab(tokenizer, size: int, counts: Optional[np.ndarray] = None) -> torch.Tensor:
    """The ids [V'] (sorted) of the `size` most frequent tokens by `counts` [vocab] (default: the
    stdlib's, `stdlib_counts`), with every added token too."""
    if counts is None:
        counts = stdlib_counts(tokenizer)
    order = np.argsort(-np.asarray(counts, dtype=np.float64), kind="stable")
    keep = set(order[:size].tolist()) | set(added_ids(tokenizer))
    return torch.tensor(sorted(keep), dtype=torch.long)


def added_ids(tokenizer) -> list[int]:
    """Every added token's id (control tokens, chat markers) and the EOS ids."""
    return sorted(set(tokenizer.backend.get_added_tokens_decoder()) | set(tokenizer.eos_token_ids))


def stdlib_counts(tokenizer) -> np.ndarray:
    """Token counts [vocab] over the stdlib's source, cached per tokenizer beside the n-gram models
    (tokenising the stdlib takes seconds)."""
    from ..loading.paths import cache_dir
    from ..training.corpus import build_corpus
    root = cache_dir()
    path = os.path.join(root, f"counts-{tokenizer.fingerprint()[:16]}-stdlib.npy") if root else None
    if path is not None and os.path.exists(path):
        return np.load(path)
    from tqdm.auto import tqdm
    counts = np.bincount(build_corpus(tokenizer, progress=tqdm).astype(np.int64), minlength=tokenizer.vocab_size)
    if path is not None:
        os.makedirs(root, exist_ok=True)
        np.save(path, counts)
    return counts
