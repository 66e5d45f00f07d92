"""`specserve train-draft`: distil an EAGLE-style draft (models/eagle.py) from a target model.

Data, all offline: the Python standard library's source (teacher-forced) and, optionally, the
target's own greedy continuations of function prompts cut from it and its own answers (through its
chat template) to instructions written for training (training/instructions.py: chat, summaries,
translations, math, questions, code explanations) — self-distillation: the draft then sees text the
way the target writes it, beyond code too. Each step runs the frozen target over [B, L] chunks to get
its last hidden states f and its next-token distributions p, and trains the draft on

    loss = CE(p restricted to the draft's vocabulary, draft distribution) + w_reg * SmoothL1(f_hat, f)

(EAGLE's two terms: the first is what acceptance depends on, the second keeps predicted features
usable as the next draft step's input). Inputs get a little noise, as in EAGLE, because at drafting
time the draft's own features are fed back. Checkpoints every `checkpoint_every` steps; a rerun of the
same command resumes from the last one and gives the same weights as an uninterrupted run.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..loading import load_model_files
from ..models.eagle import EagleConfig, EagleNet
from .config import DistillConfig
from .corpus import build_corpus, function_prompts
from .instructions import instructions
from .target import DenseTarget

CKPT_FILE = "checkpoint.pt"


def _data(cfg: DistillConfig, tokenizer, log) -> tuple[np.ndarray, list[tuple[int, int, float]]]:
    """-> (all tokens, [(start, end, sampling weight)] of its parts: stdlib, function continuations,
    instruction answers)."""
    os.makedirs(cfg.out, exist_ok=True)
    corpus_file = os.path.join(cfg.out, "corpus.npy")
    if not os.path.exists(corpus_file):
        np.save(corpus_file, build_corpus(tokenizer, cfg.corpus_tokens, progress=tqdm))
    parts, weights, names = [np.load(corpus_file)], [1.0 - cfg.gen_weight * bool(cfg.generate)
                                                     - cfg.instr_weight * bool(cfg.instructions)], ["stdlib"]
    if weights[0] < 0:
        raise ValueError(f"gen_weight {cfg.gen_weight} + instr_weight {cfg.instr_weight} exceed 1")
    if cfg.generate:
        gen_file = os.path.join(cfg.out, f"generations-{cfg.generate}x{cfg.gen_tokens}{'-private' if cfg.gen_private else ''}.npy")
        if not os.path.exists(gen_file):
            prompts = function_prompts(cfg.generate, cfg.seed, private=cfg.gen_private)
            log(f"generating {cfg.gen_tokens} tokens for each of {len(prompts)} function prompts with the target")
            np.save(gen_file, _generate(cfg, tokenizer, prompts))
        parts.append(np.load(gen_file))
        weights.append(cfg.gen_weight)
        names.append("function continuations")
    if cfg.instructions:
        instr_file = os.path.join(cfg.out, f"answers-{cfg.instructions}x{cfg.gen_tokens}.npy")
        if not os.path.exists(instr_file):
            convs = [c for _, c in instructions(cfg.instructions, cfg.seed)]
            prompts = [tokenizer.encode(tokenizer.apply_chat_template(c), add_special_tokens=False) for c in convs]
            log(f"answering {len(prompts)} instructions (up to {cfg.gen_tokens} tokens) with the target")
            np.save(instr_file, _generate(cfg, tokenizer, prompts))
        parts.append(np.load(instr_file))
        weights.append(cfg.instr_weight)
        names.append("instruction answers")
    log("data: " + " + ".join(f"{len(p):,} ({n})" for p, n in zip(parts, names)) + " tokens")
    bounds, start = [], 0
    for p, w in zip(parts, weights):
        bounds.append((start, start + len(p), w))
        start += len(p)
    return np.concatenate(parts).astype(np.int64), bounds


def _generate(cfg: DistillConfig, tokenizer, prompts: list) -> np.ndarray:
    """The target's greedy continuations of the prompts (texts or token ids), each prompt + answer + EOS."""
    from ..engine.llm import LLM
    from ..types import SamplingParams
    # On a GPU a step costs about the same for 1 or 1,024 sequences (launch-bound): batch wide.
    gpu = cfg.device.startswith("cuda")
    llm = LLM(cfg.model, device=cfg.device, max_num_seqs=1024 if gpu else 64, max_num_batched_tokens=16384 if gpu else 4096,
              kv_cache_gib=24.0 if gpu else 1.0)
    # prompts with no room for an answer within the target's context are left out (not cut: a cut
    # instruction is another instruction)
    ids = [p if isinstance(p, list) else llm.tokenizer.encode(p) for p in prompts]
    ids = [x for x in ids if len(x) + cfg.gen_tokens <= llm.engine.max_model_len]
    outs = llm.generate(ids, SamplingParams(temperature=0, max_tokens=cfg.gen_tokens), use_tqdm=True)
    eos = tokenizer.eos_token_ids[:1]
    return np.concatenate([np.asarray(o.prompt_token_ids + o.outputs[0].token_ids + eos, dtype=np.uint16) for o in outs])


def _draft_vocab(data: np.ndarray, vocab_size: int, size: int, always: list[int]) -> list[int]:
    """The `size` most frequent tokens of the data, `always` (EOS; a draft's head being grown) in, sorted."""
    counts = np.bincount(data, minlength=vocab_size)
    counts[always] = counts.max() + 1
    return sorted(np.argsort(-counts, kind="stable")[:min(size, vocab_size)].tolist())


class _Batches:
    """Seeded random [B, L + 1] windows: batch i is the same whatever happened before (resume-safe)."""

    def __init__(self, data: np.ndarray, cfg: DistillConfig, device):
        self.data, self.cfg, self.device = data, cfg, device

    def get(self, i: int, ranges: list[tuple[int, int, float]]) -> torch.Tensor:
        """Batch i, each window drawn from range (lo, hi) with that range's weight."""
        L = self.cfg.seq_len + 1
        rng = np.random.default_rng([self.cfg.seed, i])
        ranges = [r for r in ranges if r[1] - r[0] > L and r[2] > 0]
        w = np.array([r[2] for r in ranges]) / sum(r[2] for r in ranges)
        which = rng.choice(len(ranges), size=self.cfg.batch_size, p=w)
        starts = [rng.integers(ranges[j][0], ranges[j][1] - L) for j in which]
        return torch.from_numpy(np.stack([self.data[s:s + L] for s in starts])).to(self.device)


def _losses(net: EagleNet, target: DenseTarget, ids: torch.Tensor, vocab_ids: torch.Tensor, cfg: DistillConfig,
            noise: float, gen: Optional[torch.Generator] = None):
    """ids [B, L + 1] -> (loss, reg loss, cls loss, top-1 agreement with the target) on one batch."""
    B, L1 = ids.shape
    feats = target.hidden(ids).float()  # [B, L + 1, hidden] (no grad)
    x_feat, y_feat = feats[:, :-1], feats[:, 1:]  # row t reads f_t, predicts f_{t+1}
    if noise:
        rms = x_feat.pow(2).mean(-1, keepdim=True).sqrt()
        x_feat = x_feat + noise * rms * torch.randn(x_feat.shape, generator=gen, device=x_feat.device)
    embeds = F.embedding(ids[:, 1:], target.embed).float()  # token at t + 1
    cos, sin = target.rope_tables(L1 - 1)
    pred = net.forward_dense(embeds, x_feat, cos.float(), sin.float())  # [B, L, hidden]
    with torch.no_grad():
        t_logp = torch.log_softmax(target.logits(y_feat.to(target.dtype)), dim=-1)  # [B, L, vocab]: the token at t + 2
        t_arg = t_logp.argmax(-1)
        p_sub = t_logp.index_select(-1, vocab_ids).exp()  # [B, L, V_draft]
    d_logits = F.linear(target.rms(pred, target.norm.float()), target.lm_head[vocab_ids].float())  # [B, L, V_draft]
    cls = -(p_sub * torch.log_softmax(d_logits, dim=-1)).sum(-1).mean()
    reg = F.smooth_l1_loss(pred, y_feat)
    acc = (vocab_ids[d_logits.argmax(-1)] == t_arg).float().mean()
    return cls + cfg.w_reg * reg, reg.detach(), cls.detach(), acc.detach()


def _evaluate(net: EagleNet, target: DenseTarget, batches: _Batches, held_out: tuple[int, int],
              vocab_ids: torch.Tensor, cfg: DistillConfig) -> tuple[float, float]:
    """(top-1 agreement, classification loss) on the held-out batches (the same ones every call)."""
    net.eval()
    with torch.no_grad():
        evals = [_losses(net, target, batches.get(10**9 + i, [(*held_out, 1.0)]), vocab_ids, cfg, 0.0)
                 for i in range(cfg.eval_batches)]
    net.train()
    return round(float(np.mean([float(e[3]) for e in evals])), 4), round(float(np.mean([float(e[2]) for e in evals])), 4)


def train_draft(cfg: DistillConfig, log=print) -> dict:
    """Train (or resume) and write the draft to cfg.out/draft. Returns the final metrics."""
    torch.manual_seed(cfg.seed)
    device = torch.device(cfg.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    _, arch, weights, tokenizer = load_model_files(cfg.model, keep_quantized=False)
    data, bounds = _data(cfg, tokenizer, log)
    n_eval = max(cfg.seq_len * 4, len(data) // 50)  # the last 2% is held out (of the last part)
    train_hi = eval_lo = len(data) - n_eval
    train_ranges = [(lo, min(hi, train_hi), w) for lo, hi, w in bounds if lo < train_hi]
    if train_hi < cfg.seq_len + 2:
        raise ValueError(f"only {len(data)} tokens of data; need more than {cfg.seq_len * 5}")
    if cfg.init_from:
        net = EagleNet.load(cfg.init_from)
        vocab = net.cfg.vocab_ids
        if cfg.draft_vocab > len(vocab):
            # The head is rows of the target's own LM head, so growing it costs no parameters: add the
            # training data's most frequent tokens the draft cannot propose yet (text beyond code needs
            # them: the shipped draft's code vocabulary covers 85% of its instruction answers' tokens).
            vocab = _draft_vocab(data[:train_hi], arch.vocab_size, cfg.draft_vocab, vocab)
            net.cfg.vocab_ids = vocab
    else:
        vocab = _draft_vocab(data[:train_hi], arch.vocab_size, cfg.draft_vocab, tokenizer.eos_token_ids)
        net = EagleNet(EagleConfig.for_target(arch, vocab, tokenizer.fingerprint()))
        layer = cfg.init_layer % arch.num_hidden_layers
        net.init_from_target_layer({k: v for k, v in weights.items() if k.startswith(f"layers.{layer}.")}, layer)
    net = net.to(device)
    coverage = float(np.isin(data[eval_lo:], vocab).mean())
    log(f"draft vocabulary: {len(vocab)} tokens, covering {coverage:.1%} of held-out tokens")
    target = DenseTarget(arch, weights, device, _target_dtype(cfg.target_dtype, device))
    del weights
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    step, history = 0, []
    ckpt = os.path.join(cfg.out, CKPT_FILE)
    if os.path.exists(ckpt):
        state = torch.load(ckpt, map_location=device, weights_only=False)
        if state["config"] != _resumable(cfg):
            raise ValueError(f"{ckpt} was written with other settings; use another --out or delete it")
        net.load_state_dict(state["net"])
        opt.load_state_dict(state["opt"])
        step, history = state["step"], state["history"]
        log(f"resuming from step {step}")
    vocab_ids = torch.tensor(vocab, device=device)
    batches = _Batches(data, cfg, device)
    gen = torch.Generator(device=device)
    evaluate = lambda: _evaluate(net, target, batches, (eval_lo, len(data)), vocab_ids, cfg)
    before = evaluate() if cfg.init_from and step == 0 else None  # the starting draft on the same held-out data
    bar = tqdm(total=cfg.steps, initial=step, desc="train-draft", unit="step")
    t0 = time.perf_counter()
    net.train()
    while step < cfg.steps:
        if cfg.time_limit_s and time.perf_counter() - t0 > cfg.time_limit_s:
            log(f"time limit reached at step {step} of {cfg.steps}")
            break
        lr = cfg.lr * min(1.0, (step + 1) / cfg.warmup) * 0.5 * (1 + math.cos(math.pi * step / cfg.steps))
        for g in opt.param_groups:
            g["lr"] = lr
        gen.manual_seed(cfg.seed * 1_000_003 + step)
        loss, reg, cls, acc = _losses(net, target, batches.get(step, train_ranges), vocab_ids, cfg, cfg.noise, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        step += 1
        loss = loss.detach()
        history.append([step, float(loss), float(reg), float(cls), float(acc)])
        bar.set_postfix(loss=f"{float(loss):.3f}", acc=f"{float(acc):.3f}")
        bar.update(1)
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            tmp = ckpt + ".tmp"
            torch.save({"net": net.state_dict(), "opt": opt.state_dict(), "step": step, "history": history,
                        "config": _resumable(cfg)}, tmp)
            os.replace(tmp, ckpt)
    bar.close()
    agreement, cls_loss = evaluate()
    metrics = {"steps": step, "train_seconds_this_run": round(time.perf_counter() - t0, 1),
               "eval_top1_agreement": agreement, "eval_cls_loss": cls_loss,
               "draft_vocab_coverage": round(coverage, 4), "data_tokens": int(len(data))}
    if before:
        metrics["eval_top1_agreement_before"], metrics["eval_cls_loss_before"] = before
    net.cfg.training = {"config": asdict(cfg), "metrics": metrics,
                        "earlier": EagleNet.load(cfg.init_from).cfg.training if cfg.init_from else None}
    net.save(os.path.join(cfg.out, "draft"))
    log(f"draft written to {os.path.join(cfg.out, 'draft')}: {metrics}")
    return metrics


def _target_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        fast_bf16 = device.type == "cuda" or (device.type == "cpu" and torch.cpu._is_amx_tile_supported())
        name = "bfloat16" if fast_bf16 else "float32"
    return getattr(torch, name)


def _resumable(cfg: DistillConfig) -> dict:
    """The settings a checkpoint must share with the run that resumes it (not steps: training longer is fine
    only if the schedule is the same, so steps stays in)."""
    d = asdict(cfg)
    for k in ("out", "device", "checkpoint_every", "eval_batches", "time_limit_s", "target_dtype"):
        d.pop(k)
    return d
