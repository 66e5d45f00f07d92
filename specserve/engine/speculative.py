"""Speculative decoding inside the step loop: draft before scheduling, verify after the target pass.

Each step, for the requests that are decoding:
  1. the draft-length policy says how long drafts may be; the cost model (measured target pass
     times by number of rows, measured draft step times, measured acceptance) picks the length up to
     that which it predicts to give the most tokens per second, and when that is 0 (drafting would
     cost more than it yields) the step is a plain decoding step (tried again later);
  2. the drafter proposes; the tokens become `request.draft_token_ids`, which the scheduler simply
     counts as more tokens to compute;
  3. after the target pass, `verify` turns each request's 1 + k logits rows into accepted tokens plus
     one more (modified rejection sampling, or prefix match for greedy), and the engine moves
     `num_computed_tokens` to 1 + accepted, which rolls the rejected rows back.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ..drafters.base import Draft, Drafter
from ..drafters.policies import DraftLengthPolicy
from ..sampling.rejection import rejection_sample, verify_greedy
from ..sampling.sampler import warp_logits
from ..types import Request, RequestStatus


@dataclass
class SpecStats:
    target_steps: int = 0
    spec_steps: int = 0  # target steps that verified drafts
    fallback_steps: int = 0  # decode steps where the cost model chose not to draft
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0  # verify spans that ended in a rejection (not all drafts accepted)
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    decode_tokens: int = 0  # tokens emitted by decode steps (spec or not)
    decode_seq_steps: int = 0  # (sequence, decode step) pairs

    @property
    def alpha(self) -> Optional[float]:
        """Per-token acceptance rate, the maximum-likelihood estimate under a geometric model."""
        return self.accepted / (self.accepted + self.rejections) if self.accepted + self.rejections else None

    @property
    def acceptance_rate(self) -> Optional[float]:
        return self.accepted / self.drafted if self.drafted else None

    def as_dict(self) -> dict:
        return {"target_steps": self.target_steps, "spec_steps": self.spec_steps, "fallback_steps": self.fallback_steps,
                "drafted": self.drafted, "accepted": self.accepted, "alpha": self.alpha,
                "acceptance_rate": self.acceptance_rate,
                "tokens_per_target_step": self.decode_tokens / self.decode_seq_steps if self.decode_seq_steps else None,
                "draft_seconds": round(self.draft_seconds, 4), "target_seconds": round(self.target_seconds, 4)}


class CostModel:
    """Seconds per step as a function of the number of target rows (the whole step after drafting:
    target pass, verification, bookkeeping; measured while serving, seeded by a calibration of bare
    target passes plus the measured difference), seconds per draft step by batch size, and acceptance.
    Predicts the tokens per second of a step with a given draft length."""

    def __init__(self, ema: float = 0.3):
        self.target: dict[int, float] = {}  # measured whole-step seconds by rows
        self.calibrated: dict[int, float] = {}  # bare target pass seconds by rows
        self.draft: dict[int, float] = {}
        self.ema = ema
        self.alpha_num, self.alpha_den = 0.0, 0.0  # decayed counts of accepted and (accepted + rejections)

    def record_target(self, rows: int, seconds: float) -> None:
        old = self.target.get(rows)
        self.target[rows] = seconds if old is None else (1 - self.ema) * old + self.ema * seconds

    def record_calibration(self, rows: int, seconds: float) -> None:
        self.calibrated[rows] = seconds

    def step_seconds(self, rows: int) -> Optional[float]:
        if rows in self.target or not self.calibrated:
            return self._interp(self.target, rows)
        # Unmeasured: the bare pass plus what steps measured so far cost beyond their bare pass.
        extra = [self.target[r] - self.calibrated[r] for r in self.target if r in self.calibrated]
        return self._interp(self.calibrated, rows) + (sum(extra) / len(extra) if extra else 0.0)

    def record_draft(self, batch: int, seconds_per_step: float) -> None:
        old = self.draft.get(batch)
        self.draft[batch] = seconds_per_step if old is None else (1 - self.ema) * old + self.ema * seconds_per_step

    def record_acceptance(self, accepted: int, rejections: int, decay: float = 0.9) -> None:
        self.alpha_num = decay * self.alpha_num + accepted
        self.alpha_den = decay * self.alpha_den + accepted + rejections

    @property
    def alpha(self) -> Optional[float]:
        return self.alpha_num / self.alpha_den if self.alpha_den > 0 else None

    @staticmethod
    def _interp(table: dict[int, float], x: int) -> Optional[float]:
        if not table:
            return None
        if x in table:
            return table[x]
        keys = sorted(table)
        lo = [k for k in keys if k < x]
        hi = [k for k in keys if k > x]
        if lo and hi:
            a, b = lo[-1], hi[0]
            return table[a] + (table[b] - table[a]) * (x - a) / (b - a)
        if len(keys) == 1:  # one point: scale with the rows above it (pessimistic), flat below
            return table[keys[0]] * max(1.0, x / keys[0])
        a, b = (keys[-2], keys[-1]) if lo else (keys[0], keys[1])
        slope = (table[b] - table[a]) / (b - a)
        return max(table[a] + slope * (x - a), 1e-6)

    def tokens_per_second(self, batch: int, k: int, alpha: Optional[float] = None,
                          calibrated_only: bool = False) -> Optional[float]:
        """Predicted emitted tokens per second of a step with drafts of length k (k = 0: plain decoding).
        calibrated_only: use only the startup calibration (fixed for the engine's life) and a draft step
        of DRAFT_COST_GUESS target passes, so the answer does not move with the machine's timings."""
        if calibrated_only:
            if not self.calibrated:
                return None
            t_target = self._interp(self.calibrated, batch * (k + 1))
            t_draft = DRAFT_COST_GUESS * self._interp(self.calibrated, 1)
        else:
            t_target, t_draft = self.step_seconds(batch * (k + 1)), self._interp(self.draft, batch)
            alpha = self.alpha if alpha is None else alpha
        if t_target is None:
            return None
        if k == 0:
            return batch / t_target
        if alpha is None or t_draft is None:
            return None
        alpha = min(alpha, 0.999)
        expected = (1 - alpha ** (k + 1)) / (1 - alpha)  # Leviathan et al.: tokens per step per sequence
        return batch * expected / (t_target + k * t_draft)

    def break_even_confidence(self, batch: int) -> Optional[float]:
        """The acceptance probability at which one more draft token per sequence pays for itself: its
        share of a verify row plus a draft step, over the time per token of plain decoding
        (batch 1 on this CPU: (3.3 + 1.5) / 11.4 ms ~ 0.4; batch 8: ~0.7)."""
        t_plain, t_more = self.step_seconds(batch), self.step_seconds(2 * batch)
        t_draft = self._interp(self.draft, batch)
        if t_plain is None or t_more is None or t_draft is None:
            return None
        t_row = max(0.0, t_more - t_plain) / batch
        return min(1.0, (batch * t_row + t_draft) / t_plain)

    def best_len(self, batch: int, k: int, margin: float = 1.05, **kw) -> Optional[int]:
        """The draft length <= k with the most predicted tokens per second (None: not measured yet).
        Drafting must beat plain decoding by `margin`: a bet predicted to break even loses on average
        (the prediction leaves out probes and catch-up work)."""
        rates = [self.tokens_per_second(batch, j, **kw) for j in range(k + 1)]
        if any(r is None for r in rates):
            return None
        best = max(range(k + 1), key=lambda j: (rates[j], -j))
        return best if rates[best] > margin * rates[0] else 0


DRAFT_COST_GUESS = 0.1  # draft step / target step, for decisions that must not depend on live timings


class SpeculativeDecoder:
    def __init__(self, drafter: Drafter, make_policy: Callable[[], DraftLengthPolicy], fallback: bool = True,
                 retry_every: int = 16, prior_alpha: float = 0.5):
        self.drafter, self.make_policy, self.fallback = drafter, make_policy, fallback
        self.policy = make_policy()  # shared by the batch, as BASS adapts one length for all
        # A seeded sampled request gets a policy of its own, and its fallback looks only at its own
        # acceptance and the start-up calibration: its draft lengths, and so its random draws, then
        # depend on its own tokens (not on the batch or on live timings), and the seed reproduces it.
        self.own_policies: dict[str, DraftLengthPolicy] = {}
        self.costs = CostModel()
        # A weak prior (2 pseudo-tokens) so the first steps already weigh drafting against plain decoding.
        self.costs.alpha_num, self.costs.alpha_den = 2 * prior_alpha, 2.0
        self.stats = SpecStats()
        # After this many plain steps in a row, probe the acceptance (one extra row: ~2% of a batch-1 run
        # at worst, and a dip in the estimate does not leave drafting off for long).
        self.retry_every = retry_every
        self._since_spec = 0
        self._probe_turn = 0
        self._drafts: dict[str, Draft] = {}

    @staticmethod
    def _seeded(r: Request) -> bool:
        return r.seed is not None and not r.params.greedy

    # --- before scheduling ----------------------------------------------------------------------
    def propose(self, running: list[Request]) -> None:
        decoding = [r for r in running if r.status == RequestStatus.RUNNING and r.num_tokens - r.num_computed_tokens == 1]
        shared = [r for r in decoding if not self._seeded(r)]
        # Seeded requests with the same length (and threshold) draft together: one draft pass each
        # step for the lot, not one per request (a request's draws come from its own generator).
        same_len: dict[tuple, list[Request]] = {}
        for r in decoding:
            if self._seeded(r):
                policy = self.own_policies.setdefault(r.request_id, self.make_policy())
                k = policy.draft_len()
                if self.fallback:  # from the request's own acceptance and the fixed calibration only
                    k = self.costs.best_len(len(decoding), k, alpha=_own_alpha(r), calibrated_only=True)
                    k = policy.draft_len() if k is None else k
                if k:
                    same_len.setdefault((k, policy.min_confidence), []).append(r)
        for (k, min_confidence), group in same_len.items():
            self._draft(group, k, min_confidence)
        if not shared:
            return
        k = self.policy.draft_len()
        if self.fallback:
            if self._since_spec >= self.retry_every:
                # A cheap probe that keeps the acceptance estimate fresh: one draft token for one
                # sequence (rotating), a single extra row in the batch.
                self._since_spec = 0
                self._probe_turn = (self._probe_turn + 1) % len(shared)
                self._draft([shared[self._probe_turn]], 1, None)
                return
            best = self.costs.best_len(len(shared), k)
            k = k if best is None else best
            if k == 0:
                self.stats.fallback_steps += 1
                self._since_spec += 1
                return
        self._since_spec = 0
        # Confidence gating: a draft token is worth its verify row (and its draft step) only if it is
        # likely enough to be accepted; the drafters' confidences are calibrated acceptance estimates.
        gate = self.costs.break_even_confidence(len(shared)) if self.fallback else None
        floors = [c for c in (self.policy.min_confidence, gate) if c is not None]
        self._draft(shared, k, max(floors) if floors else None, gate)

    def _draft(self, requests: list[Request], k: int, min_confidence: Optional[float], gate: Optional[float] = None) -> None:
        t0 = time.perf_counter()
        drafts = self.drafter.propose(requests, k, min_confidence)
        seconds = time.perf_counter() - t0
        longest = max((len(d.tokens) for d in drafts), default=0)  # draft steps run
        if gate is not None:
            drafts = [_gated(d, gate) for d in drafts]
        # Time drafting only in steady state: after a prompt, plain steps or a probe the drafter first
        # catches up on every token it missed, a one-off that is not what a draft step costs.
        steady = self.drafter.last_catchup_rows <= len(requests) * (k + 1)
        if longest:
            if steady:
                self.costs.record_draft(len(requests), seconds / longest)
            self.stats.draft_seconds += seconds
        for r, d in zip(requests, drafts):
            if d.tokens:
                r.draft_token_ids = list(d.tokens)
                self._drafts[r.request_id] = d

    # --- after the target pass ------------------------------------------------------------------
    def verify(self, requests: list[Request], logits: list[torch.Tensor], generators: list) -> list[tuple[int, list[int]]]:
        """requests with drafts; logits[i] [1 + k_i, vocab] for request i. Returns, per request, the number
        of accepted drafts and the tokens to emit (the accepted drafts + one from the target)."""
        emitted: list[list[int]] = [[] for _ in requests]
        accepted = [0] * len(requests)
        greedy = [i for i, r in enumerate(requests) if r.params.greedy]
        sampled = [i for i, r in enumerate(requests) if not r.params.greedy]
        if greedy:
            for i, (a, nxt) in zip(greedy, verify_greedy([logits[i] for i in greedy],
                                                         [requests[i].draft_token_ids for i in greedy])):
                accepted[i] = a
                emitted[i] = requests[i].draft_token_ids[:a] + [nxt]
        if sampled:
            K = max(len(requests[i].draft_token_ids) for i in sampled)
            V = logits[sampled[0]].shape[-1]
            dev = logits[sampled[0]].device
            num = torch.tensor([len(requests[i].draft_token_ids) for i in sampled], device=dev)
            tokens = torch.zeros(len(sampled), K, dtype=torch.long, device=dev)
            for row, i in enumerate(sampled):
                ids = requests[i].draft_token_ids
                tokens[row, :len(ids)] = torch.tensor(ids, device=dev)
            p = torch.zeros(len(sampled), K + 1, V, device=dev)
            draft_probs = [self._drafts[requests[i].request_id].probs for i in sampled]
            # None: a deterministic draft, q = one-hot (all None: rejection_sample takes q = None)
            q = None if all(d is None for d in draft_probs) else torch.zeros(len(sampled), K, V, device=dev)
            for row, i in enumerate(sampled):
                p[row, :len(logits[i])] = warp_logits(logits[i], requests[i].params)
                if q is not None and draft_probs[row] is not None:
                    q[row, :len(draft_probs[row])] = draft_probs[row]
                elif q is not None:
                    n = len(requests[i].draft_token_ids)
                    q[row, torch.arange(n, device=dev), tokens[row, :n]] = 1.0
            n_acc, nxt = rejection_sample(p, q, tokens, num, [generators[i] for i in sampled])
            for row, i in enumerate(sampled):
                a = int(n_acc[row])
                accepted[i] = a
                emitted[i] = requests[i].draft_token_ids[:a] + [int(nxt[row])]
        drafted = [len(r.draft_token_ids) for r in requests]
        confidences = [self._drafts.pop(r.request_id).confidence for r in requests]
        rejections = sum(a < n for a, n in zip(accepted, drafted))
        shared = [i for i, r in enumerate(requests) if not self._seeded(r)]
        if shared:
            self.policy.update([drafted[i] for i in shared], [accepted[i] for i in shared], [confidences[i] for i in shared])
        for i, r in enumerate(requests):
            if self._seeded(r):
                self.own_policies[r.request_id].update([drafted[i]], [accepted[i]], [confidences[i]])
        self.costs.record_acceptance(sum(accepted), rejections)
        s = self.stats
        s.spec_steps += 1
        s.drafted += sum(drafted)
        s.accepted += sum(accepted)
        s.rejections += rejections
        for r, a, n in zip(requests, accepted, drafted):
            r.spec_drafted.append(n)
            r.spec_accepted.append(a)
        return list(zip(accepted, emitted))

    def record_step(self, rows: int, seconds: float, target_seconds: float) -> None:
        """A step's target rows, its seconds after drafting, and the target pass's share of them."""
        self.costs.record_target(rows, seconds)
        self.stats.target_steps += 1
        self.stats.target_seconds += target_seconds

    def release(self, request: Request) -> None:
        self._drafts.pop(request.request_id, None)
        self.own_policies.pop(request.request_id, None)
        self.drafter.release(request)

    @property
    def c(self) -> Optional[float]:
        """Draft step time / target step time at batch 1 (Leviathan's c), from the measurements."""
        t_draft = self.costs._interp(self.costs.draft, 1)
        t_target = self.costs.step_seconds(1)
        return t_draft / t_target if t_draft and t_target else None


def _gated(d: Draft, gate: float) -> Draft:
    """The draft cut before its first token whose cumulative confidence (the estimated chance that it
    and every token before it are accepted) is below `gate`. Cutting on draft-side information only
    leaves verification exact."""
    cum, n = 1.0, 0
    for c in d.confidence:
        cum *= c
        if cum < gate:
            break
        n += 1
    if n == len(d.tokens):
        return d
    return Draft(d.tokens[:n], None if d.probs is None else d.probs[:n], d.confidence[:n])


def _own_alpha(r: Request) -> Optional[float]:
    """A request's own acceptance estimate from its verify steps (None before the first)."""
    accepted = sum(r.spec_accepted)
    rejections = sum(a < n for a, n in zip(r.spec_accepted, r.spec_drafted))
    return accepted / (accepted + rejections) if accepted + rejections else None
