"""The step loop: schedule -> run the model -> sample -> append, detokenise, stop, free."""
from __future__ import annotations

import itertools
import time
from typing import Optional

import torch

from ..attention.paged import AttentionMetadata
from ..config import EngineConfig, SpeculativeConfig
from ..drafters import build_drafter, make_policy
from ..kv.block_manager import BlockManager
from ..kv.cache import KVCache
from ..loading import IncrementalDetokenizer, load_model_files
from ..models import build_model
from ..sampling.sampler import make_generator, sample
from ..scheduler.scheduler import Scheduler
from ..types import FinishReason, Request, RequestStatus, SamplingParams
from .runner import ModelRunner
from .speculative import SpeculativeDecoder

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        mc = config.model
        if mc.num_threads:
            torch.set_num_threads(mc.num_threads)
        self.device = torch.device(mc.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device cuda requested but torch sees no CUDA device")
        self.dtype = _DTYPES[mc.resolved_dtype()]
        if self.dtype == torch.float16 and self.device.type == "cpu":
            raise ValueError("float16 is for CUDA; on CPU use float32 (default) or bfloat16")
        t0 = time.perf_counter()
        self.model_path, self.arch, weights, self.tokenizer = load_model_files(mc.model, keep_quantized=mc.block_kernels)
        self.max_model_len = config.scheduler.max_model_len or self.arch.max_position_embeddings
        self.model = build_model(self.arch, weights, self.dtype, self.device, use_blocks=mc.block_kernels,
                                 max_len=self.max_model_len)
        del weights
        self.load_time = time.perf_counter() - t0

        cc = config.cache
        per_block = KVCache.bytes_per_block(self.arch.num_hidden_layers, cc.block_size, self.arch.num_key_value_heads,
                                            self.arch.head_dim, self.dtype)
        num_blocks = cc.num_blocks or max(1, int(cc.kv_cache_gib * 2**30) // per_block)
        self.kv = KVCache(self.arch.num_hidden_layers, num_blocks, cc.block_size, self.arch.num_key_value_heads,
                          self.arch.head_dim, self.dtype, self.device)
        self.scheduler = Scheduler(BlockManager(num_blocks, cc.block_size), config.scheduler.max_num_seqs,
                                   config.scheduler.max_num_batched_tokens)
        spec = config.speculative
        # Without speculation too: the C++ paged kernel (split) on CPU, one padded SDPA call on CUDA.
        attention = (spec or SpeculativeConfig()).resolved_attention(mc.device)
        self.runner = ModelRunner(self.model, self.kv, self.device, attention=attention)
        self.spec: Optional[SpeculativeDecoder] = None
        if spec is not None:
            drafter = build_drafter(spec, self.model, self.tokenizer, self.model_path, num_blocks, cc.block_size, attention)
            self.spec = SpeculativeDecoder(drafter, lambda: make_policy(spec.policy, spec.draft_len), spec.fallback)
            if spec.fallback:
                self._calibrate()
        self._ids = itertools.count()
        self._generators: dict[str, torch.Generator] = {}
        self._detok: dict[str, IncrementalDetokenizer] = {}
        self._siblings: dict[str, list[Request]] = {}  # leader id -> siblings waiting for its prompt KV

    # --- requests -----------------------------------------------------------------------------
    def add_request(self, prompt_token_ids: list[int], params: SamplingParams) -> list[Request]:
        """Queue one prompt; returns its n sample requests (the first is the leader that prefills)."""
        if not prompt_token_ids:
            raise ValueError("the prompt is empty")
        if len(prompt_token_ids) >= self.max_model_len:
            raise ValueError(f"the prompt has {len(prompt_token_ids)} tokens; the model's context is {self.max_model_len}")
        vocab = self.arch.vocab_size
        if max(prompt_token_ids) >= vocab or min(prompt_token_ids) < 0:
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        group = str(next(self._ids))
        reqs = []
        for i in range(params.n):
            seed = None if params.seed is None else params.seed + i
            r = Request(f"{group}-{i}", list(prompt_token_ids), params, seed=seed, group_id=group, sample_index=i)
            self._generators[r.request_id] = make_generator(seed, self.device)
            self._detok[r.request_id] = IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens)
            reqs.append(r)
        self.scheduler.add(reqs[0])
        for r in reqs[1:]:
            r.status = RequestStatus.WAITING_FOR_FORK
            r.leader = reqs[0]
        if len(reqs) > 1:
            self._siblings[reqs[0].request_id] = reqs[1:]
        return reqs

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._siblings)

    def _calibrate(self, context: int = 128, rows=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)) -> None:
        """Time target passes over 1..64 rows once, so the speculation cost model starts from measured
        numbers (it keeps measuring while serving)."""
        bm, bs = self.scheduler.blocks, self.kv.block_size
        rows = [n for n in rows if n <= self.config.scheduler.max_num_batched_tokens]
        table: list[int] = []
        if not bm.can_allocate(table, context + max(rows)):
            return
        bm.allocate(table, context + max(rows))
        dev = self.device
        try:
            for n in [1] + rows:  # the first pass warms up
                meta = AttentionMetadata.build([n], [context + n], [table], bs, dev, mode=self.runner.attention)
                ids = torch.zeros(n, dtype=torch.long, device=dev)
                pos = torch.arange(context, context + n, device=dev)
                best = float("inf")
                for _ in range(3):  # the fastest of three: a one-off stall would bend the whole curve
                    t0 = time.perf_counter()
                    logits = self.model.forward(ids, pos, meta, self.kv.k, self.kv.v, torch.arange(n, device=dev))
                    if dev.type == "cuda":
                        torch.cuda.synchronize()
                    best = min(best, time.perf_counter() - t0)
                    del logits
                self.spec.costs.record_calibration(n, best)
        finally:
            bm.free(table)

    # --- one step -----------------------------------------------------------------------------
    def step(self) -> list[tuple[Request, str]]:
        """Run one forward pass; returns (request, new text) for every request that got tokens."""
        spec = self.spec
        if spec is not None:
            spec.propose(self.scheduler.running)
        t0 = time.perf_counter()
        plan = self.scheduler.schedule()
        if spec is not None:
            for r in plan.preempted:
                spec.release(r)
        if not plan.scheduled:
            return []
        want_hidden = spec is not None and spec.drafter.wants_hidden_states
        out = self.runner.execute(plan.scheduled, return_hidden=want_hidden)
        logits, hidden = out if want_hidden else (out, None)  # [S, vocab], [T, hidden]
        if spec is not None and self.device.type == "cuda":
            torch.cuda.synchronize()
        now = time.perf_counter()

        # Split the logits rows: one per plain sampler, 1 + k per request verifying k drafts.
        samplers, sampler_rows, verifiers, verifier_logits = [], [], [], []
        row = 0
        for s in plan.scheduled:
            if s.samples:
                k = len(s.request.draft_token_ids)
                if k:
                    verifiers.append(s.request)
                    verifier_logits.append(logits[row:row + k + 1])
                else:
                    samplers.append(s.request)
                    sampler_rows.append(row)
                row += k + 1
        accepted = {}
        if verifiers:
            verified = spec.verify(verifiers, verifier_logits, [self._generators[r.request_id] for r in verifiers])
            accepted = {r.request_id: v for r, v in zip(verifiers, verified)}

        # KV bookkeeping: plain rows are all kept; a verify span keeps its last token + the accepted drafts.
        offset = 0
        for s in plan.scheduled:
            r, start, n = s.request, s.request.num_computed_tokens, s.num_new_tokens
            a = accepted.get(r.request_id, (None,))[0]
            valid = n if a is None else 1 + a
            r.num_computed_tokens = start + valid
            if a is not None:
                r.draft_token_ids = []
                self.scheduler.blocks.truncate(r.block_table, r.num_computed_tokens)
            if spec is not None:
                spec.drafter.observe(r, start, None if hidden is None else hidden[offset:offset + valid], a or 0)
            offset += n

        plain_decoding = sum(1 for r in samplers if r.output_token_ids)  # decode steps, not prompt ends
        results = self._sample_plain(samplers, sampler_rows, logits, now) if samplers else []
        for r, rows in zip(verifiers, verifier_logits):
            emitted = accepted[r.request_id][1]
            lp = torch.log_softmax(rows.float(), -1)[torch.arange(len(emitted)), torch.tensor(emitted)].tolist() \
                if r.params.logprobs else [None] * len(emitted)
            delta = ""
            for tok, tok_lp in zip(emitted, lp):
                delta += self._append(r, tok, tok_lp, now)
                if r.is_finished:
                    break
            results.append((r, delta))
        if spec is not None:
            spec.record_step(sum(s.num_new_tokens for s in plan.scheduled), time.perf_counter() - t0, now - t0,
                             len(plan.scheduled))
            spec.stats.decode_seq_steps += plain_decoding + len(verifiers)
            spec.stats.decode_tokens += plain_decoding + sum(len(accepted[r.request_id][1]) for r in verifiers)
        return results

    def _sample_plain(self, samplers: list[Request], rows: list[int], logits: torch.Tensor, now: float):
        # Leaders finishing their prompt sample for all their siblings from the same logits row.
        take, row_reqs = [], []
        for i, r in zip(rows, samplers):
            group = [r] + (self._siblings.pop(r.request_id, []) if not r.output_token_ids else [])
            take.extend([i] * len(group))
            row_reqs.extend(group)
        params = [r.params for r in row_reqs]
        gens = [self._generators[r.request_id] for r in row_reqs]
        want_lp = any(p.logprobs for p in params)
        tokens, logprobs = sample(logits[take] if take != list(range(logits.shape[0])) else logits, params, gens, want_lp)

        # Fork before any token is appended: appending may finish the leader and free its blocks.
        copies = []
        for r in row_reqs:
            if r.status == RequestStatus.WAITING_FOR_FORK:
                copies += self.scheduler.fork(r.leader, r)
                if self.spec is not None:
                    self.spec.drafter.fork(r.leader, r)
                r.leader = None
        if copies:
            self.kv.copy_blocks(copies)
        return [(r, self._append(r, tok, logprobs[j] if want_lp else None, now))
                for j, (r, tok) in enumerate(zip(row_reqs, tokens))]

    def _append(self, r: Request, token: int, logprob: Optional[float], now: float) -> str:
        r.output_token_ids.append(token)
        if logprob is not None and r.params.logprobs:
            r.output_logprobs.append(logprob)
        if r.first_token_time is None:
            r.first_token_time = now
        p = r.params
        delta = self._detok[r.request_id].step(r.output_token_ids)
        finish = None
        if not p.ignore_eos and token in self.tokenizer.eos_token_ids:
            finish, r.stop_reason, delta = FinishReason.STOP, None, ""
        elif token in p.stop_token_ids:
            finish, r.stop_reason, delta = FinishReason.STOP, token, ""
        else:
            old_len = len(r.text)
            r.text += delta
            for stop in p.stop:
                # Only the new text (plus a stop string's length of context) can hold a new match.
                at = r.text.find(stop, max(0, old_len - len(stop) + 1))
                if at >= 0:
                    delta = r.text[old_len:at] if at >= old_len else ""
                    r.text = r.text[:at]
                    finish, r.stop_reason = FinishReason.STOP, stop
                    break
            if finish is None and (len(r.output_token_ids) >= p.max_tokens or r.num_tokens >= self.max_model_len):
                finish = FinishReason.LENGTH
        if finish is not None:
            r.finish_reason = finish
            r.finish_time = now
            self.scheduler.finish(r)
            if self.spec is not None:
                self.spec.release(r)
            self._generators.pop(r.request_id, None)
            self._detok.pop(r.request_id, None)
        return delta
