"""Drafters: one interface (base.py), one file per method. `build_drafter` picks the class from the
speculative config and what the draft files are; the engine never branches on the method."""
from __future__ import annotations

import os

from ..config import SpeculativeConfig
from ..loading import EMBEDDED_FILE
from .base import Draft, Drafter
from .policies import DraftLengthPolicy, make_policy

SHIPPED_DRAFTS = {EMBEDDED_FILE: "smollm2-135m-instruct-eagle"}  # target file name -> draft under specserve/weights


def default_draft_path(target_path: str) -> str:
    name = SHIPPED_DRAFTS.get(os.path.basename(target_path))
    if name is None:
        raise ValueError(f"no draft ships for {os.path.basename(target_path)}; pass speculative={{'draft_model': PATH}} "
                         "(an EAGLE draft from `specserve train-draft`, or any model with the same tokenizer)")
    return os.path.join(os.path.dirname(os.path.dirname(__file__)), "weights", name)


def build_drafter(spec: SpeculativeConfig, target, tokenizer, target_path: str, num_blocks: int, block_size: int,
                  attention: str = "split") -> Drafter:
    """target: the serving model; tokenizer: the target's; attention: the resolved PAD/SPLIT mode."""
    if spec.method == "lookup":
        from .prompt_lookup import PromptLookupDrafter
        return PromptLookupDrafter(spec.lookup_max_ngram)
    path = spec.draft_model or default_draft_path(target_path)
    if os.path.isdir(path) and os.path.exists(os.path.join(path, "config.json")) and \
            os.path.exists(os.path.join(path, "model.safetensors")) and _is_eagle(path):
        model = _eagle(path, attention, target, tokenizer, num_blocks, block_size)
    else:
        model = _draft_model(path, attention, target, tokenizer, num_blocks, block_size)
    if spec.method == "lookup+draft":
        from .lookup_first import LookupFirstDrafter
        from .prompt_lookup import PromptLookupDrafter
        return LookupFirstDrafter(PromptLookupDrafter(spec.lookup_max_ngram, min_ngram=2), model)
    return model


def _is_eagle(path: str) -> bool:
    import json
    with open(os.path.join(path, "config.json")) as f:
        return "vocab_ids" in json.load(f)


def _eagle(path, attention, target, tokenizer, num_blocks, block_size):
    from ..models.eagle import EagleNet
    from .eagle import EagleDrafter
    net = EagleNet.load(path)
    cfg, arch = net.cfg, target.arch
    if cfg.target_vocab_size != arch.vocab_size or (cfg.tokenizer_sha256 and cfg.tokenizer_sha256 != tokenizer.fingerprint()):
        raise ValueError(f"{path}: this draft was trained for another tokenizer/vocabulary "
                         f"({cfg.target_vocab_size} tokens) than the target's ({arch.vocab_size} tokens)")
    if cfg.hidden_size != arch.hidden_size:
        raise ValueError(f"{path}: draft hidden size {cfg.hidden_size} does not match the target's {arch.hidden_size}")
    return EagleDrafter(net, target, num_blocks, block_size, attention)


def _draft_model(path, attention, target, tokenizer, num_blocks, block_size):
    from ..loading import load_model_files
    from ..models import build_model
    from .draft_model import DraftModelDrafter
    _, arch, weights, draft_tok = load_model_files(path, keep_quantized=True)
    if draft_tok.fingerprint() != tokenizer.fingerprint() or arch.vocab_size != target.arch.vocab_size:
        raise ValueError(f"{path}: the draft's tokenizer/vocabulary ({arch.vocab_size} tokens) differs from the "
                         f"target's ({target.arch.vocab_size} tokens); a draft must share the target's tokenizer")
    model = build_model(arch, weights, target.dtype, target.device, use_blocks=True,
                        max_len=target.rotary.cos.shape[0])
    return DraftModelDrafter(model, num_blocks, block_size, attention)


__all__ = ["Draft", "Drafter", "DraftLengthPolicy", "build_drafter", "default_draft_path", "make_policy"]
