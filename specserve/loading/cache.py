"""A cache of parsed model files, keyed by the file's content hash.

The gguf package's reader takes ~4 s on the embedded model (it walks 100k vocabulary strings
field by field); the parsed result (architecture, tokenizer, weights still in their blocks) loads
from this cache in a fraction of that. Set SPECSERVE_CACHE_DIR to move it, or to "" to disable.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import warnings
from typing import Callable, Optional

import numpy as np
import torch
from tokenizers import Tokenizer as HFTokenizer

from .tokenizer import Tokenizer
from .weights import ModelArch, QuantizedWeight

CACHE_VERSION = 1


def cache_dir() -> Optional[str]:
    d = os.environ.get("SPECSERVE_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "specserve"))
    return d or None


def file_hash(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()[:32]


def _pack(arch: ModelArch, weights: dict, tok: Tokenizer) -> dict:
    w = {}
    for name, t in weights.items():
        if isinstance(t, QuantizedWeight):
            with warnings.catch_warnings():  # a read-only view of the file, only ever saved: never written
                warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
                raw = torch.from_numpy(np.ascontiguousarray(t.raw))
            w[name] = {"type": t.type_name, "raw": raw, "shape": t.shape}
        else:
            w[name] = t
    return {"version": CACHE_VERSION, "arch": dataclasses.asdict(arch), "weights": w,
            "tokenizer": {"json": tok.backend.to_str(), "eos": tok.eos_token_ids, "bos": tok.bos_token_id,
                          "add_bos": tok.add_bos, "template": tok.chat_template, "special": tok.special_tokens}}


def _unpack(d: dict):
    arch = ModelArch(**d["arch"])
    weights = {}
    for name, t in d["weights"].items():
        weights[name] = QuantizedWeight(t["type"], t["raw"].numpy(), tuple(t["shape"])) if isinstance(t, dict) else t
    tk = d["tokenizer"]
    tok = Tokenizer(HFTokenizer.from_str(tk["json"]), tk["eos"], tk["bos"], tk["add_bos"], tk["template"], tk["special"])
    return arch, weights, tok


def cached_load(path: str, tag: str, load: Callable[[], tuple]) -> tuple:
    """load() -> (arch, weights, tokenizer), through the cache when one is configured."""
    d = cache_dir()
    if d is None:
        return load()
    cache_file = os.path.join(d, f"{file_hash(path)}-{tag}-v{CACHE_VERSION}.pt")
    if os.path.exists(cache_file):
        try:
            return _unpack(torch.load(cache_file, mmap=True, weights_only=False))
        except Exception:
            pass  # unreadable (an interrupted write, another version): rebuild it
    result = load()
    try:
        os.makedirs(d, exist_ok=True)
        tmp = cache_file + f".tmp{os.getpid()}"
        torch.save(_pack(*result), tmp)
        os.replace(tmp, cache_file)
    except OSError:
        pass  # a read-only home: just don't cache
    return result
