"""DistillConfig: the settings of `specserve train-draft` (torch-free, so the CLI builds its parser
without importing torch)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

TARGET_DTYPES = ("auto", "float32", "bfloat16")


@dataclass
class DistillConfig:
    out: str = "draft-train"  # workspace: token files, checkpoint, and the draft in out/draft
    model: Optional[str] = None  # target; None: the embedded SmolLM2-135M-Instruct
    corpus_tokens: int = 0  # stdlib tokens to use; 0: all of them
    generate: int = 0  # function prompts the target continues greedily (self-distillation data)
    gen_tokens: int = 128
    gen_private: bool = False  # prompts from _private functions too (about 20% more)
    instructions: int = 0  # instructions (training/instructions.py) the target answers through its chat template
    # size of the draft's reduced LM head (most frequent tokens of the data); with init_from, a size
    # above the draft's grows its head by the data's most frequent tokens it lacks
    draft_vocab: int = 8192
    init_layer: int = -1  # target layer the draft's decoder layer starts from (-1: the last)
    init_from: Optional[str] = None  # continue from an existing draft directory (its vocabulary is kept)
    seq_len: int = 512
    batch_size: int = 16
    steps: int = 2000
    lr: float = 1e-3
    warmup: int = 100
    w_reg: float = 0.1
    noise: float = 0.05  # input feature noise, relative to each feature vector's RMS
    gen_weight: float = 0.5  # share of each batch drawn from the target's generations (when there are any)
    instr_weight: float = 0.3  # share drawn from its instruction answers (when there are any)
    time_limit_s: float = 0  # stop early (and still write the draft) after this long; 0: no limit
    checkpoint_every: int = 200
    eval_batches: int = 8
    device: str = "cpu"
    # the frozen target's matmuls: "auto" = bfloat16 on a GPU or a CPU with AMX tiles (about 3x the fp32
    # matmul rate of a 2-core AMX Xeon), else float32; the draft itself always trains in fp32
    target_dtype: str = "auto"
    seed: int = 0
