"""`specserve train-draft`: one flag per DistillConfig field (training/distill.py)."""
from __future__ import annotations

import argparse
import dataclasses

from ..training.config import TARGET_DTYPES, DistillConfig
from .args import add_dataclass_args

HELP = {
    "out": "workspace: token files, checkpoint.pt (resumed when present), the draft in OUT/draft",
    "model": "target model (default: the embedded SmolLM2-135M)",
    "corpus_tokens": "stdlib tokens to use (0: all)",
    "generate": "function prompts the target continues greedily, as self-distillation data",
    "gen_private": "also continue _private functions' prompts (more self-distillation data)",
    "instructions": "instructions beyond code (chat, summaries, translations, math, questions, code explanations) "
                    "the target answers through its chat template, as self-distillation data",
    "instr_weight": "share of each batch drawn from the instruction answers",
    "draft_vocab": "tokens in the draft's reduced LM head",
    "device": "cpu or cuda[:N]",
    "target_dtype": "auto, float32 or bfloat16: the frozen target's dtype (auto: bfloat16 on a GPU or an AMX CPU)",
    "time_limit_s": "stop early after this many seconds, still writing the draft",
}


def add_train_draft_args(p: argparse.ArgumentParser) -> None:
    add_dataclass_args(p, DistillConfig, HELP)


def cmd_train_draft(args) -> int:
    from ..training.distill import train_draft
    cfg = DistillConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(DistillConfig)})
    for name in ("steps", "batch_size", "seq_len", "draft_vocab"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
    if cfg.target_dtype not in TARGET_DTYPES:
        raise ValueError(f"--target-dtype must be one of {', '.join(TARGET_DTYPES)}, not {cfg.target_dtype!r}")
    train_draft(cfg)
    return 0
