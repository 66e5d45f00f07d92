"""The step loop: schedule -> run the model -> sample -> append, detokenise, stop, free."""
from __future__ import annotations

import functools
import itertools
import numbers
import sys
import time
from dataclasses import dataclass
from typing import Optional

import torch

from ..config import EngineConfig, SpeculativeConfig
from ..drafters import Drafter, DrafterContext, TreeShape, build_drafter
from ..kv.block_manager import BlockManager
from ..kv.cache import KVCache
from ..loading import IncrementalDetokenizer, load_model_files
from ..loading.tokenizer import read_chat_template
from ..loading.validate import validate_loaded
from ..models import build_model
from ..sampling.bad_words import bad_word_forms
from ..sampling.bias import add_logit_bias, keep_allowed
from ..sampling.penalties import PenaltySpan, apply_penalties
from ..sampling.sampler import make_generator, sample, token_logprobs
from ..scheduler.scheduler import ScheduledRequest, Scheduler
from ..speculative import Calibrator, Observed, SpeculativeDecoder, StepResult, VerifiedDraft, calibrate, make_policy, measure_prefill_chunk
from ..speculative.verify import Verified, is_seeded, verify
from ..types import FinishReason, Request, RequestStatus, SamplingParams, TokenOrigin
from . import rounds
from .guided import GuidedDecoding, prune_drafts
from .malloc import keep_freed_memory
from .runner import ModelRunner, StepOutput
from .threads import ThreadGovernor

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class _Live:
    """What the engine keeps per unfinished request besides the Request itself."""

    request: Request
    generator: torch.Generator
    detok: IncrementalDetokenizer
    guide: Optional[object] = None  # guided.Guide: where the sequence stands in its grammar
    bad_words: tuple[tuple[int, ...], ...] = ()  # params.bad_words' token forms (sampling/bad_words.py)


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        mc = config.model
        if mc.num_threads:
            torch.set_num_threads(mc.num_threads)
        self.device = torch.device(mc.device)
        # Unpinned CPU threads follow the machine's load (engine/threads.py); --threads pins them.
        self.threads = ThreadGovernor(torch.get_num_threads(), torch.set_num_threads) \
            if not mc.num_threads and self.device.type == "cpu" and torch.get_num_threads() > 1 else None
        self._pinned_threads = mc.num_threads if self.device.type == "cpu" else None
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device cuda requested but torch sees no CUDA device")
        self.dtype = _DTYPES[mc.resolved_dtype()]
        if self.dtype == torch.float16 and self.device.type == "cpu":
            raise ValueError("float16 is for CUDA; on CPU use float32 (default) or bfloat16")
        t0 = time.perf_counter()
        template = None if mc.chat_template is None else read_chat_template(mc.chat_template)  # refused before loading
        self.model_path, self.arch, weights, self.tokenizer = load_model_files(mc.model, keep_quantized=mc.block_kernels)
        if template is not None:
            self.tokenizer.set_chat_template(template)
        self.max_model_len = config.scheduler.max_model_len or self.arch.max_position_embeddings
        if self.max_model_len > self.arch.max_position_embeddings:
            raise ValueError(f"max_model_len {self.max_model_len} exceeds the model's context "
                             f"({self.arch.max_position_embeddings} tokens)")
        cc = config.cache
        self.kv_dtype = _kv_dtype(cc.kv_cache_dtype, self.dtype, self.device)
        per_block = KVCache.bytes_per_block(self.arch.num_hidden_layers, cc.block_size, self.arch.num_key_value_heads,
                                            self.arch.head_dim, self.kv_dtype)
        num_blocks = cc.num_blocks or max(1, int(cc.kv_cache_gib * 2**30) // per_block)
        validate_loaded(self.model_path, self.arch, weights, config, self.dtype, num_blocks * per_block, self.max_model_len)
        self.model = build_model(self.arch, weights, self.dtype, self.device, use_blocks=mc.block_kernels,
                                 max_len=self.max_model_len, activations=mc.activations)
        del weights
        self.load_time = time.perf_counter() - t0
        self.weight_kernel = self.model.layers[0].gate_up.kernel  # the MLP's product: most of a step's weights

        self.kv = KVCache(self.arch.num_hidden_layers, num_blocks, cc.block_size, self.arch.num_key_value_heads,
                          self.arch.head_dim, self.kv_dtype, self.device)
        spec_config = config.speculative
        # Without speculation too: the C++ paged kernel (split) on CPU, one padded SDPA call on CUDA.
        attention = (spec_config or SpeculativeConfig()).resolved_attention(mc.device)
        # PAD/SPLIT is how verify spans are batched; a step without drafts runs as regular decoding does:
        # a forced "pad" on CPU also took the plain steps it falls back to off the C++ kernel and the
        # fused layer, so falling back could not get back to regular decoding's speed
        # (docs/decisions.md#plain-attention)
        plain = SpeculativeConfig().resolved_attention(mc.device)
        self.runner = ModelRunner(self.model, self.kv, self.device, attention=attention, plain_attention=plain,
                                  exact_prompts=mc.activations == "int8")
        if self.device.type == "cuda" and mc.cuda_graphs:
            self.runner = _graph_runner(self.runner, config, self.max_model_len)
        self.speculator: Optional[SpeculativeDecoder] = None
        if spec_config is not None:
            ctx = DrafterContext(self.model, self.tokenizer, self.model_path, num_blocks, cc.block_size, attention,
                                 prefix_features=self.kv.read_features,
                                 kv_dtype=None if cc.kv_cache_dtype == "auto" else self.kv_dtype)
            self.speculator = SpeculativeDecoder(build_drafter(spec_config, ctx),
                                                 lambda: make_policy(spec_config.policy, spec_config.draft_len),
                                                 spec_config.fallback, shape=spec_config.shape,
                                                 tree=TreeShape(spec_config.tree_top_k, spec_config.tree_beam,
                                                                spec_config.tree_max_nodes))
        if self.speculator is not None and hasattr(self.runner, "graphs"):  # the CUDA-graph runner
            _graph_drafter(self.speculator.drafter, config, self.max_model_len)
        self.rounds = None  # engine/rounds.py's RoundsDriver: greedy decode rounds on the GPU
        if mc.cuda_rounds and hasattr(self.runner, "graphs"):
            self.rounds = rounds.build(self.runner, self.speculator, mc.cuda_rounds, config)
        # Prefix caching skips the prefill of cached blocks; a drafter that reads the target's hidden state
        # at every position (EAGLE) would miss theirs, so the KV keeps them beside every slot.
        self.prefix_caching = cc.enable_prefix_caching
        if self.prefix_caching and self.speculator is not None and self.speculator.wants_hidden_states:
            self.kv.keep_features(self.arch.hidden_size)
        sc = config.scheduler
        blocks = BlockManager(num_blocks, cc.block_size, self.prefix_caching)
        self.prefill_chunk = sc.prefill_chunk  # SARATHI's chunk: "auto" measures this machine's
        if sc.prefill_chunk == "auto":
            graphs = hasattr(self.runner, "graphs")  # on CUDA: timed on the path prompts take (graphs, fused kernels)
            key = (self.model_path, mc.resolved_dtype(), mc.device, mc.block_kernels, mc.activations,
                   torch.get_num_threads(), graphs, cc.kv_cache_dtype)
            timer = (lambda table, n, repeats: self.runner.time_pass(table, n, 0, repeats=repeats, prompt=True)) if graphs else None
            self.prefill_chunk = measure_prefill_chunk(key, self.model, self.kv, blocks, sc.max_num_batched_tokens,
                                                       time_fn=timer)
        self.scheduler = Scheduler(blocks, sc.max_num_seqs, sc.max_num_batched_tokens, self.prefill_chunk)
        if spec_config is not None:
            if spec_config.fallback:
                self.speculator.calibrator = Calibrator(self.speculator.costs, functools.partial(
                    calibrate, self.speculator.costs, self.model, self.kv, self.scheduler.blocks, attention, plain,
                    config.scheduler.max_num_batched_tokens, time_fn=getattr(self.runner, "time_pass", None)))
                self.speculator.calibrator.take()
        self.guided = GuidedDecoding(self.tokenizer, config.guided.fast_forward)
        self._ids = itertools.count()
        self._live: dict[str, _Live] = {}
        self._siblings: dict[str, list[Request]] = {}  # leader id -> siblings waiting for its prompt KV
        if self.device.type == "cpu":  # from here on, a step's large temporaries stay mapped for the next
            keep_freed_memory()

    # --- requests -----------------------------------------------------------------------------
    def add_request(self, prompt_token_ids: list[int], params: SamplingParams) -> list[Request]:
        """Queue one prompt; returns its sample requests (n, or best_of; the first is the leader that
        prefills)."""
        prompt_token_ids, bad_words = self._check(prompt_token_ids, params)
        group = str(next(self._ids))
        reqs = []
        for i in range(params.num_samples):
            seed = None if params.seed is None else params.seed + i
            r = Request(f"{group}-{i}", list(prompt_token_ids), params, seed=seed, group_id=group, sample_index=i)
            self._live[r.request_id] = _Live(r, make_generator(seed, self.device),
                                             IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens),
                                             self.guided.guide(params), bad_words)
            reqs.append(r)
        if params.prompt_logprobs is not None:  # the leader scores the prompt (its first token has no logprob)
            reqs[0].prompt_logprobs = [None]
            reqs[0].prompt_top_logprobs = [None] if params.prompt_logprobs else []
        self.scheduler.add(reqs[0])
        for r in reqs[1:]:
            r.status = RequestStatus.WAITING_FOR_FORK
            r.leader = reqs[0]
        if len(reqs) > 1:
            self._siblings[reqs[0].request_id] = reqs[1:]
        return reqs

    def check_request(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise ValueError (one line) if the prompt cannot be served; queues nothing."""
        self._check(prompt_token_ids, params)

    def _check(self, prompt_token_ids: list[int], params: SamplingParams) -> tuple[list[int], tuple[tuple[int, ...], ...]]:
        """check_request's checks; (the prompt as served (truncate_prompt_tokens), the bad words' forms)."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be SamplingParams, got {type(params).__name__}")
        params.validate()  # again: fields may have been changed since construction
        if not prompt_token_ids:
            raise ValueError("the prompt is empty")
        if (params.truncate_prompt_tokens or 0) > self.max_model_len:  # as vLLM
            raise ValueError(f"truncate_prompt_tokens ({params.truncate_prompt_tokens}) must be at most the model's context "
                             f"({self.max_model_len}), or -1")
        prompt_token_ids = params.truncated(prompt_token_ids, self.max_model_len)
        if len(prompt_token_ids) >= self.max_model_len:  # first: a huge prompt is refused without a pass over it
            raise ValueError(f"the prompt has {len(prompt_token_ids)} tokens; the model's context is {self.max_model_len}")
        if not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in prompt_token_ids):
            raise ValueError("prompt token ids must be integers")
        vocab = self.arch.vocab_size
        if max(prompt_token_ids) >= vocab or min(prompt_token_ids) < 0:
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        if params.logit_bias and max(params.logit_bias) >= vocab:
            raise ValueError(f"logit_bias token id {max(params.logit_bias)} is not in the vocabulary [0, {vocab})")
        for name in ("allowed_token_ids", "stop_token_ids"):
            ids = getattr(params, name)
            if ids and max(ids) >= vocab:
                raise ValueError(f"{name}: token id {max(ids)} is not in the vocabulary [0, {vocab})")
        forms = self._bad_words(params)
        if any(t >= vocab for f in forms for t in f):
            raise ValueError(f"bad_words: a word's token is not in the model's vocabulary [0, {vocab})")
        if params.allowed_token_ids:  # a row with every token ruled out would sample garbage
            banned = {f[0] for f in forms if len(f) == 1}  # a one-token bad word: out in every row
            if set(params.allowed_token_ids) <= banned:
                raise ValueError("allowed_token_ids: every allowed token is a bad word")
            if params.min_tokens and set(params.allowed_token_ids) <= banned | set(self._stop_ids(params)):
                raise ValueError("allowed_token_ids: with min_tokens, some allowed token must be one that does not end the output")
        # Admission: one sample's whole sequence (prompt + max_tokens, capped at the context) must fit in
        # the cache, or it would fail midway with its output lost.
        bm = self.scheduler.blocks
        need = min(len(prompt_token_ids) + params.max_tokens, self.max_model_len)
        blocks = -(-need // bm.block_size)
        if blocks > bm.num_blocks:
            raise ValueError(f"a sequence of {need} tokens (prompt {len(prompt_token_ids)} + max_tokens "
                             f"{params.max_tokens}) needs {blocks} KV blocks but the cache has {bm.num_blocks}; "
                             f"raise kv_cache_gib (now {self.config.cache.kv_cache_gib}) or lower max_tokens")
        self.guided.guide(params)  # compiles (cached) now: a bad constraint fails here, before anything is queued
        return prompt_token_ids, forms

    def abort(self, request_ids, reason: FinishReason = FinishReason.ABORT) -> list[Request]:
        """Stop these requests wherever they are: free their KV blocks, drafter state, generators and
        detokenizers; they produce nothing more (finish_reason `reason`). Unknown or finished ids are
        ignored. A leader's samples still waiting for its prompt go with it. Returns those stopped."""
        stopped = []
        for rid in list(request_ids):
            live = self._live.pop(rid, None)
            if live is None:
                continue
            r = live.request
            for sib in self._siblings.pop(rid, []):  # waiting for this leader's prompt KV: cannot start
                stopped += self.abort([sib.request_id], reason)
            if r.status == RequestStatus.WAITING_FOR_FORK and r.leader is not None:
                waiting = self._siblings.get(r.leader.request_id, [])
                if r in waiting:
                    waiting.remove(r)
                if not waiting:
                    self._siblings.pop(r.leader.request_id, None)
                r.leader = None
                r.status = RequestStatus.FINISHED
            else:
                self.scheduler.abort(r)
            if self.speculator is not None:
                self.speculator.release(r)
            r.finish_reason = reason
            r.finish_time = time.perf_counter()
            stopped.append(r)
        if self.speculator is not None and not self.has_unfinished():
            self.speculator.abandon_step()
        return stopped

    def _expire(self) -> list[tuple[Request, str]]:
        """Stop the samples whose request's time budget (best_of_deadline_s) has run out."""
        now = time.perf_counter()
        late = [rid for rid, live in self._live.items() if (d := live.request.params.best_of_deadline_s) is not None
                and now - live.request.arrival_time >= d]
        return [(r, "") for r in self.abort(late, FinishReason.DEADLINE)] if late else []

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or bool(self._siblings)

    # --- one step -----------------------------------------------------------------------------
    def step(self) -> list[tuple[Request, str]]:
        """propose -> schedule -> execute -> verify / sample -> roll back -> append (docs/architecture.md).
        Returns (request, new text) for every request that got tokens."""
        # libgomp keeps the thread count per thread: the thread stepping now may have another LLM's
        # count, or the one it started with (torch's last setting), not this engine's. (torch's setter
        # also sets the process's default for new threads and MKL's count, and rebuilds its pthreadpool
        # when the count changes: engines with different counts that take turns on one thread pay that
        # once a turn, not once a step.)
        want = self.threads.threads if self.threads is not None else self._pinned_threads
        if want and torch.get_num_threads() != want:
            torch.set_num_threads(want)
        if self.threads is None:
            return self._step()
        self.threads.begin()
        try:
            return self._step()
        finally:
            self.threads.end()

    def _step(self) -> list[tuple[Request, str]]:
        expired = self._expire()
        if self.rounds is not None and (done := self.rounds.step(self)) is not None:
            return expired + done
        spec = self.speculator
        drafts = None
        if spec is not None:
            drafts = spec.propose(self.scheduler.running, self.scheduler.prompt_rows_next(), len(self.scheduler.waiting))
            constrained = {rid: (g, live.request.params) for rid in drafts
                           if (live := self._live.get(rid)) is not None and (g := live.guide) is not None}
            if constrained:
                drafts = prune_drafts(drafts, constrained)
        t0 = time.perf_counter()
        plan = self.scheduler.schedule(drafts)
        if spec is not None:
            for r in plan.preempted:
                spec.release(r)
        if not plan.scheduled:
            return expired
        out = self.runner.execute(plan.scheduled, return_hidden=spec is not None and spec.wants_hidden_states)
        if spec is not None and self.device.type == "cuda":
            torch.cuda.synchronize()
        now = t_pass = time.perf_counter()
        for s, rows in out:
            if rows.prompt_logits is not None:
                _score_prompt(s.request, out.logits[rows.prompt_logits])

        # Requests whose step samples: one logits row each, or a verify span of 1 + k rows.
        samplers = [(s, rows) for s, rows in out if rows.logits is not None and not s.num_draft_tokens]
        verifiers = [(s, rows) for s, rows in out if s.num_draft_tokens]
        spans = [(rows.logits.start, g, s.draft)
                 for s, rows in out if rows.logits is not None and (g := self._guide(s.request)) is not None]
        # constrained rows: the grammar's mask (an n > 1 leader's first row serves its siblings too:
        # every guide starts at the grammar's start)
        if spans:
            self.guided.mask_rows(out.logits, spans)
        biased = [(rows.logits, s.request.params.logit_bias) for s, rows in out
                  if rows.logits is not None and s.request.params.logit_bias]
        if biased:  # every row, a verify span's too: drafts are verified against the biased distribution
            add_logit_bias(out.logits, biased)
        allowed = [(rows.logits, s.request.params.allowed_token_ids) for s, rows in out
                   if rows.logits is not None and s.request.params.allowed_token_ids is not None]
        if allowed:
            keep_allowed(out.logits, allowed)
        penalised = [PenaltySpan(rows.logits.start, p, r.prompt_token_ids, r.output_token_ids,
                                 s.draft.paths() if s.num_draft_tokens else (), self._stop_ids(p), live.bad_words)
                     for s, rows in out if rows.logits is not None and (live := self._live[(r := s.request).request_id])
                     and ((p := r.params).penalized or p.min_tokens > len(r.output_token_ids) or live.bad_words)]
        if penalised:  # each row with the draft tokens before it counted (sampling/penalties.py)
            apply_penalties(out.logits, penalised)
        verified: dict[str, Verified] = {}  # by request id
        if verifiers:
            reqs = [s.request for s, _ in verifiers]
            results = verify([s.draft for s, _ in verifiers], [out.logits[rows.logits] for _, rows in verifiers],
                             [r.params for r in reqs], [self._live[r.request_id].generator for r in reqs],
                             [is_seeded(r.params, r.seed) for r in reqs], spec.tree.top_k, spec.wants_span_argmax)
            for (s, _), v in zip(verifiers, results):
                verified[s.request.request_id] = v
                moves = self.scheduler.keep_rows(s.request, _root(s), v.rows)
                if moves:  # a tree's accepted path, next to its root
                    self.kv.move_slots([a for a, _ in moves], [b for _, b in moves])
        # What the step teaches, once the target's rows are settled and before any token is appended:
        # drafters roll their state back against the context the step computed (request.num_tokens
        # before this step's tokens), and appending may finish (release) a request or fork a sibling
        # from its leader's drafter state, which must already hold this step's rows.
        if spec is not None:
            spec.learn(StepResult([VerifiedDraft(s.request, s.draft, verified[s.request.request_id]) for s, _ in verifiers],
                                  self._observed(out, verified)))
            # the step's tokens are stamped once its work is done: a draft model's prefill of the step's
            # prompt chunks (in learn) belongs to the time to first token, not to the decode phase
            now = time.perf_counter()

        plain_decoding = sum(1 for s, _ in samplers if s.request.output_token_ids)  # decode steps, not prompt ends
        results = self._sample_plain(samplers, out.logits, now) if samplers else []
        for s, rows in verifiers:
            r = s.request
            v = verified[r.request_id]
            lp = token_logprobs(out.logits[rows.logits][list(v.rows)], v.tokens,
                                r.params.num_top_logprobs) if r.params.needs_logprobs else None
            delta = ""
            for j, (tok, origin) in enumerate(zip(v.tokens, v.origins)):
                delta += self._append(r, tok, None if lp is None else (lp[0][j], lp[1][j]), now, origin)
                if r.is_finished:
                    break
            results.append((r, delta))
        results = [(r, delta + self._fast_forward(r, now)) for r, delta in results]
        if spec is not None:
            spec.record_step(sum(s.num_new_tokens for s in plan.scheduled), time.perf_counter() - t0, t_pass - t0,
                             len(plan.scheduled), plain_decoding + len(verifiers),
                             plain_decoding + sum(len(v.tokens) for v in verified.values()))
        return expired + results

    def _bad_words(self, p: SamplingParams) -> tuple[tuple[int, ...], ...]:
        """p.bad_words as token forms (sampling/bad_words.py), with this model's tokenizer."""
        if not p.bad_words:
            return ()
        return bad_word_forms(p.bad_words, lambda text: self.tokenizer.encode(text, add_special_tokens=False))

    def _stop_ids(self, p: SamplingParams) -> list[int]:
        """The tokens that end an output: what min_tokens holds back."""
        return ([] if p.ignore_eos else list(self.tokenizer.eos_token_ids)) + list(p.stop_token_ids)

    def _guide(self, r: Request):
        live = self._live.get(r.request_id)
        return None if live is None else live.guide

    def _fast_forward(self, r: Request, now: float) -> str:
        """Append the tokens r's grammar forces from here, without sampling (their constrained probability
        is 1; the next pass computes them as a prefill chunk). Returns their text."""
        g = self._guide(r)
        if g is None or r.is_finished or not self.guided.fast_forward:
            return ""
        delta = ""
        for tok in g.forced():
            delta += self._append(r, tok, (0.0, {tok: 0.0}), now, TokenOrigin.GRAMMAR)
            if r.is_finished:
                break
        return delta

    @staticmethod
    def _observed(out: StepOutput, verified: dict[str, Verified]) -> list[Observed]:
        """Which of the target's rows stayed valid for each computed request (with their hidden states)."""
        observed = []
        for s, rows in out:
            v = verified.get(s.request.request_id)
            hidden = None
            if out.hidden is not None and v is None:
                hidden = out.hidden[rows.tokens]
            elif out.hidden is not None:  # the known tokens' rows, then the accepted drafts' (a tree's path)
                root = rows.tokens.start + _root(s) - s.start
                keep = list(range(rows.tokens.start, root)) + [root + j for j in v.rows]
                hidden = out.hidden[keep]
            observed.append(Observed(s.request, s.start, hidden, 0 if v is None else v.num_accepted, s.num_new_tokens))
        return observed

    def _sample_plain(self, samplers: list[tuple[ScheduledRequest, object]], logits: torch.Tensor, now: float):
        # Leaders finishing their prompt sample for all their siblings from the same logits row.
        take, row_reqs = [], []
        for s, rows in samplers:
            r = s.request
            group = [r] + (self._siblings.pop(r.request_id, []) if not r.output_token_ids else [])
            take.extend([rows.logits.start] * len(group))
            row_reqs.extend(group)
        params = [r.params for r in row_reqs]
        gens = [self._live[r.request_id].generator for r in row_reqs]
        tokens, logprobs = sample(logits[take] if take != list(range(logits.shape[0])) else logits, params, gens)

        # Fork before any token is appended: appending may finish the leader and free its blocks.
        copies = []
        for r in row_reqs:
            if r.status == RequestStatus.WAITING_FOR_FORK:
                copies += self.scheduler.fork(r.leader, r)
                r.prompt_logprobs, r.prompt_top_logprobs = list(r.leader.prompt_logprobs), list(r.leader.prompt_top_logprobs)
                if self.speculator is not None:
                    self.speculator.fork(r.leader, r)
                r.leader = None
        if copies:
            self.kv.copy_blocks(copies)
        return [(r, self._append(r, tok, None if logprobs is None else (logprobs[0][j], logprobs[1][j]), now))
                for j, (r, tok) in enumerate(zip(row_reqs, tokens))]

    def _append(self, r: Request, token: int, logprob: Optional[tuple[float, dict[int, float]]], now: float,
                origin: TokenOrigin = TokenOrigin.TARGET) -> str:
        """logprob: (the token's, the top-k {id: logprob}) from token_logprobs, where the step computed them;
        origin: who proposed the token (an accepted draft's drafter, else the target).
        A token r's grammar refuses (its mask allowed it, or fast-forward forced it, but the text the
        grammar requires has no spelling in the vocabulary: a dead end) is not appended: r finishes
        with FinishReason.ERROR and Request.error, alone (its batch goes on), as vLLM finishes a
        request whose grammar rejects its tokens."""
        guide = self._guide(r)
        if guide is not None and not guide.accept([token]):
            self._finish(r, FinishReason.ERROR, now, error=guide.refusal(token))
            return ""
        r.output_token_ids.append(token)
        r.output_origins.append(origin)
        if logprob is not None and r.params.needs_logprobs:
            r.output_logprobs.append(logprob[0])
            if r.params.num_top_logprobs:
                r.output_top_logprobs.append(dict(list(logprob[1].items())[:r.params.num_top_logprobs]))
        if r.first_token_time is None:
            r.first_token_time = now
        p = r.params
        delta = self._live[r.request_id].detok.step(r.output_token_ids)
        finish = None
        if not p.ignore_eos and token in self.tokenizer.eos_token_ids:
            finish, r.stop_reason, delta = FinishReason.STOP, None, ""
        elif token in p.stop_token_ids:
            finish, r.stop_reason, delta = FinishReason.STOP, token, ""
        else:
            old_len = len(r.text)
            r.text += delta
            for stop in p.stop if len(r.output_token_ids) > p.min_tokens else ():  # vLLM's: none before min_tokens
                # Only the new text (plus a stop string's length of context) can hold a new match.
                at = r.text.find(stop, max(0, old_len - len(stop) + 1))
                if at >= 0:
                    end = at + len(stop) if p.include_stop_str_in_output else at
                    delta = r.text[old_len:end] if end >= old_len else ""
                    r.text = r.text[:end]
                    finish, r.stop_reason = FinishReason.STOP, stop
                    break
            if finish is None and (len(r.output_token_ids) >= p.max_tokens or r.num_tokens >= self.max_model_len):
                finish = FinishReason.LENGTH
            elif finish is None and guide is not None and guide.done:  # the grammar is complete: only EOS may follow
                finish, r.stop_reason = FinishReason.STOP, None
        if finish is not None:
            self._finish(r, finish, now)
        return delta

    def _finish(self, r: Request, reason: FinishReason, now: float, error: Optional[str] = None) -> None:
        r.finish_reason, r.error = reason, error
        r.finish_time = now
        self.scheduler.finish(r)
        if self.speculator is not None:
            self.speculator.release(r)
        self._live.pop(r.request_id, None)


def _score_prompt(r: Request, logits: torch.Tensor) -> None:
    """Append the log-probabilities of r's next prompt tokens (SamplingParams.prompt_logprobs) from their
    rows' logits [R, vocab]: the raw model distribution, before any bias or grammar mask (as vLLM)."""
    done = len(r.prompt_logprobs)
    lp, top = token_logprobs(logits, r.prompt_token_ids[done:done + logits.shape[0]], r.params.prompt_logprobs)
    r.prompt_logprobs.extend(lp)
    if r.params.prompt_logprobs:
        r.prompt_top_logprobs.extend(top)


def _kv_dtype(name: str, dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The KV cache's element type: the model's (auto), or float16, which only the CPU paged kernel
    reads (it widens each key and value to f32 as it loads it)."""
    if name == "auto":
        return dtype
    if device.type != "cpu":
        raise ValueError(f"kv_cache_dtype {name} is the CPU kernels'; on CUDA the cache takes the model's dtype "
                         f"({str(dtype).removeprefix('torch.')}): leave kv_cache_dtype at auto")
    if dtype != torch.float32:
        raise ValueError(f"kv_cache_dtype {name} is for float32 models (this one runs "
                         f"{str(dtype).removeprefix('torch.')}): add --dtype float32, or leave kv_cache_dtype at auto")
    return _DTYPES[name]


def _graph_runner(eager: ModelRunner, config: EngineConfig, max_model_len: int) -> ModelRunner:
    """The CUDA-graph runner for decode and verify steps, or the eager one where Triton is missing."""
    from ..attention import triton_paged
    if not triton_paged.available():
        print("cuda_graphs: triton is not installed; every step runs eagerly", file=sys.stderr)
        return eager
    if not eager.model.graphable or any(eager.model.windows):  # cuda/forward.py graphs the Llama layer only
        print(f"cuda_graphs: {eager.model.arch.architecture} layers are not graphed yet; every step runs eagerly",
              file=sys.stderr)
        return eager
    from .graph_runner import GraphModelRunner
    if eager.device.index is not None:  # graphs capture and replay on the current device's streams
        torch.cuda.set_device(eager.device)
    sc = config.scheduler
    return GraphModelRunner(eager.model, eager.kv, eager.device, eager.attention, eager.plain_attention,
                            max_seqs=sc.max_num_seqs, max_model_len=max_model_len,
                            max_graph_tokens=min(256, sc.max_num_batched_tokens),
                            max_step_tokens=sc.max_num_batched_tokens, invariant=config.model.batch_invariant)


def _graph_drafter(drafter, config: EngineConfig, max_model_len: int) -> None:
    """The drafter's passes as CUDA graphs beside the target's: EAGLE's greedy chains (cuda/eagle_graph.py)
    and a standalone draft model's passes (cuda/draft_graph.py), alone, as a staged level or as the
    model side of a combined method ("auto", "lookup+draft")."""
    from ..drafters.draft_model import DraftModelDrafter
    from ..drafters.eagle import EagleDrafter
    max_seqs = config.scheduler.max_num_seqs
    for d in _drafter_parts(drafter):
        if isinstance(d, EagleDrafter) and d.chain_graphs is None:
            from ..cuda.eagle_graph import EagleChainGraphs
            d.chain_graphs = EagleChainGraphs(d, max_seqs, max_model_len)
        elif isinstance(d, DraftModelDrafter) and d.graphs is None and d.model.graphable and not any(d.model.windows):
            from ..cuda.draft_graph import DraftModelGraphs
            vocab = d.model.lm_head.dense.shape[0] if d.vocab_ids is None else len(d.vocab_ids)
            d.graphs = DraftModelGraphs(d.model, d.kv, max_seqs, max_model_len, vocab, head=d.head_rows)


def _drafter_parts(drafter):
    """drafter and the drafters inside it (a staged level's model and helper, a combined method's model)."""
    yield drafter
    for name in ("model", "helper"):
        part = getattr(drafter, name, None)
        if isinstance(part, Drafter):
            yield from _drafter_parts(part)


def _root(s: ScheduledRequest) -> int:
    """The position of a verify span's root: the last known token, right before the draft."""
    return s.start + s.num_new_tokens - 1 - s.num_draft_tokens
