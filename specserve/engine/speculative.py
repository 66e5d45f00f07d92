"""Speculative decoding inside the step loop: draft before scheduling, verify after the target pass.

Each step, for the requests that are decoding:
  1. the draft-length policy says how far to draft; the cost model (what drafting steps of this batch
     size yielded per second, tokens over their measured step and draft-model time, against what plain
     steps of the batch size measure) says whether drafting pays, and when it does not the step is a plain
     decoding step that verifies only free drafts (prompt lookups), with a drafting step now and then
     to measure again;
  2. the drafter proposes; `select_drafts` keeps, for the whole batch, the draft tokens whose chance of
     acceptance (their calibrated confidence) beats what their rows cost on the step-time curve; they
     become `request.draft_token_ids`, which the scheduler simply counts as more tokens to compute;
  3. after the target pass, `verify` turns each request's 1 + k logits rows into accepted tokens plus
     one more (modified rejection sampling, or prefix match for greedy), and the engine moves
     `num_computed_tokens` to 1 + accepted, which rolls the rejected rows back.
"""
from __future__ import annotations

import bisect
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


DRAFT_COST_GUESS = 0.1  # draft step / target step, for decisions that must not depend on live timings
# Drafting must yield this much more than plain steps. Break-even drafting is not neutral: it speeds the
# sequences whose drafts are accepted and slows the rest with longer steps, so the sequences that finish
# first (most of the mean per-token latency) lose. Batch 8 on a 2-core CPU, where drafting breaks even on
# throughput: mean per-token latency 0.93-0.97x of RD with drafting, 0.98-0.99x with it off.
DRAFTING_MARGIN = 1.05


class CostModel:
    """Seconds per step as a function of the number of target rows (the whole step after drafting:
    target pass, verification, bookkeeping; measured while serving, seeded by a calibration of bare
    target passes plus the measured difference), seconds per draft step by batch size, and acceptance.
    Predicts the tokens per second of a step with a given draft length."""

    def __init__(self, ema: float = 0.3):
        self.target: dict[int, float] = {}  # measured whole-step seconds by rows
        self.calibrated: dict[int, float] = {}  # bare target pass seconds by rows
        self.draft: dict[int, float] = {}
        self.scale: dict[int, float] = {}  # whole step over the bare pass, by sequences in the step
        self.ema = ema
        self.alpha_num, self.alpha_den = 0.0, 0.0  # decayed counts of accepted and (accepted + rejections)
        # What drafting steps actually yielded, by batch size: [tokens emitted per sequence, seconds of
        # drafting, seconds of the step after drafting], averaged over steps.
        self.yields: dict[int, list[float]] = {}
        self.plain: dict[int, float] = {}  # measured seconds of steps without drafts, by batch size

    def record_target(self, rows: int, seconds: float, batch: Optional[int] = None) -> None:
        if batch is not None and rows == batch:  # one row per sequence: a plain decoding step
            old = self.plain.get(batch)
            self.plain[batch] = seconds if old is None else (1 - self.ema) * old + self.ema * seconds
        old = self.target.get(rows)
        self.target[rows] = seconds if old is None else (1 - self.ema) * old + self.ema * seconds
        if batch is not None and self.calibrated and rows <= max(self.calibrated):  # not prefill-sized steps
            # Whole steps of `batch` sequences against the bare passes over their rows: this covers
            # what grows with the sequences (sampling, bookkeeping, attention over more of them) and,
            # above all, the machine running faster or slower than at calibration (a shared VM
            # drifts by tens of percent), which would otherwise skew the curve's slope against its level.
            ratio = seconds / self._interp(self.calibrated, rows)
            old = self.scale.get(batch)
            self.scale[batch] = ratio if old is None else (1 - self.ema) * old + self.ema * ratio

    def record_calibration(self, rows: int, seconds: float) -> None:
        """A bare pass over `rows` rows (record in increasing rows). A pass over more rows is never
        cheaper: a measurement below the one before is noise, and would bend the curve."""
        below = [self.calibrated[r] for r in self.calibrated if r < rows]
        self.calibrated[rows] = max([seconds] + below)

    def step_seconds(self, rows: int, batch: Optional[int] = None) -> Optional[float]:
        """A whole step's seconds with `rows` target rows (over `batch` sequences, when known: then the
        bare pass over the rows times what whole steps of that batch size measure against bare passes;
        measured steps of one row count mix batch sizes, and a table of them fills in slowly)."""
        curve = self.step_curve(rows, rows, batch)
        return None if curve is None else curve[0]

    def step_curve(self, lo: int, hi: int, batch: Optional[int] = None) -> Optional[list[float]]:
        """step_seconds(rows, batch) for rows = lo .. hi, in one go (the draft selection scans it every step)."""
        if not self.target and not self.calibrated:
            return None
        scale, extra, measured = 1.0, 0.0, self.target
        if batch is not None and batch in self.scale:
            scale, measured = self.scale[batch], {}
        else:
            # Without steps of this batch size: measured steps by rows, else the bare pass plus what
            # steps measured so far cost beyond their bare pass.
            diffs = [self.target[r] - self.calibrated[r] for r in self.target if r in self.calibrated]
            extra = sum(diffs) / len(diffs) if diffs else 0.0
        if not self.calibrated:
            return [self._interp(self.target, r) for r in range(lo, hi + 1)]
        table, keys = self.calibrated, sorted(self.calibrated)
        out = []
        for rows in range(lo, hi + 1):
            if rows in measured:
                out.append(measured[rows])
            elif _between_keys(keys, rows):
                i = bisect.bisect_left(keys, rows)
                a, b = keys[i - 1], keys[i]
                out.append((table[a] + (table[b] - table[a]) * (rows - a) / (b - a)) * scale + extra)
            else:
                out.append(self._interp(table, rows) * scale + extra)
        return out

    def draft_step_seconds(self, batch: int) -> Optional[float]:
        """Measured seconds of one steady draft step at this batch size (interpolated; None before any)."""
        return self._interp(self.draft, batch)

    def record_draft(self, batch: int, seconds_per_step: float) -> None:
        old = self.draft.get(batch)
        self.draft[batch] = seconds_per_step if old is None else (1 - self.ema) * old + self.ema * seconds_per_step

    def record_acceptance(self, accepted: int, rejections: int, decay: float = 0.9) -> None:
        self.alpha_num = decay * self.alpha_num + accepted
        self.alpha_den = decay * self.alpha_den + accepted + rejections

    @property
    def alpha(self) -> Optional[float]:
        return self.alpha_num / self.alpha_den if self.alpha_den > 0 else None

    def record_yield(self, batch: int, tokens: int, draft_seconds: float, step_seconds: float,
                     ema: float = 0.2) -> None:
        """A drafting step over `batch` sequences emitted `tokens`; its drafting took draft_seconds and
        the rest of the step (target pass, verification, bookkeeping) step_seconds."""
        new = [tokens / batch, draft_seconds, step_seconds]
        old = self.yields.get(batch)
        self.yields[batch] = new if old is None else [(1 - ema) * o + ema * n for o, n in zip(old, new)]

    def drafting_pays(self, batch: int, margin: float = DRAFTING_MARGIN) -> Optional[bool]:
        """Whether drafting steps at this batch size emit more tokens per second than plain steps, by at
        least `margin`, from what drafting steps yielded so far (None: none measured yet). Unlike a
        prediction from the acceptance rate, this counts what the formula leaves out: drafts cut by the
        selection (verified rows per sequence well below k), draft passes whose tokens all got cut."""
        y = self.yields.get(batch)
        t_plain = self.plain.get(batch) or self.step_seconds(batch, batch)
        if y is None or t_plain is None:
            return None
        # Both sides as measured at this batch size: a verify step costs more than the cost curve says
        # for its rows (verification, attention over several query rows per sequence, bookkeeping), and
        # at batch 4 the curve's estimate had drafting win where it lost 7%.
        tokens, t_draft, t_step = y
        return tokens / (t_step + t_draft) > margin / t_plain

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
            t_target, t_draft = self.step_seconds(batch * (k + 1)), self.draft_step_seconds(batch)
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
        t_plain, t_more = self.step_seconds(batch, batch), self.step_seconds(2 * batch, batch)
        if t_plain is None or t_more is None:
            return None
        t_draft = self.draft_step_seconds(batch)
        if t_draft is None:  # before the first draft step is timed
            t_draft = DRAFT_COST_GUESS * self.step_seconds(1)
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


class SpeculativeDecoder:
    def __init__(self, drafter: Drafter, make_policy: Callable[[], DraftLengthPolicy], fallback: bool = True,
                 retry_every: int = 4, retry_max: int = 16, prior_alpha: float = 0.5):
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
        # After retry plain steps in a row, one drafting step measures again whether drafting pays;
        # retry starts at retry_every and doubles (up to retry_max) while those probes find it does not
        # (so at worst one losing drafting step every retry_max steps: a few percent of a run at most).
        self.retry_every, self.retry_max = retry_every, retry_max
        self._retry = retry_every
        self._probed = False
        self._since_spec = 0
        self._step_yield: Optional[list] = None  # this step's drafting, for CostModel.record_yield
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
        batch = len(shared)
        if self.fallback and self._since_spec < self._retry:
            # Draft when drafting steps at this batch size have been paying; before any has been
            # measured, when the acceptance rate predicts it pays. After a run of plain steps, one
            # drafting step to measure again (conditions change along a sequence).
            pays = self.costs.drafting_pays(batch)
            if pays is None:
                best = self.costs.best_len(batch, k)
                k = k if best is None else best
            elif not pays:
                k = 0
            if self._probed:
                self._retry = self.retry_every if k else min(2 * self._retry, self.retry_max)
                self._probed = False
            if k == 0:
                self.stats.fallback_steps += 1
                self._since_spec += 1
                # Free drafts (lookups) are still verified where they pay.
                free = self.drafter.propose_free(shared, self.policy.draft_len())
                if free is not None:
                    self._use(shared, self._select(free))
                return
        else:
            self._probed = self.fallback and self._since_spec > 0
        self._since_spec = 0
        # Drafting stops where a token is unlikely enough not to pay for its verify row and draft step
        # at the rate a batch's second row costs; `_select` then cuts along the measured cost curve.
        gate = self.costs.break_even_confidence(batch) if self.fallback else None
        floors = [c for c in (self.policy.min_confidence, gate) if c is not None]
        self._step_yield = [batch, batch, 0.0]  # batch, tokens, draft seconds
        self._draft(shared, k, max(floors) if floors else None, select=self.fallback)

    def _draft(self, requests: list[Request], k: int, min_confidence: Optional[float], select: bool = False) -> None:
        t0 = time.perf_counter()
        drafts = self.drafter.propose(requests, k, min_confidence)
        seconds = time.perf_counter() - t0
        longest = max((len(d.tokens) for d in drafts), default=0)
        # Draft-model passes only: a step whose drafts all came from lookups ran none, and timing it as
        # draft steps would drag the per-step estimate (and so every drafting decision) towards zero.
        passes, model_batch = self.drafter.last_model_passes, self.drafter.last_model_batch
        # Time drafting only in steady state: after a prompt, plain steps or a probe the drafter first
        # catches up on every token it missed, a one-off that is not what a draft step costs.
        steady = self.drafter.last_catchup_rows <= model_batch * (k + 1)
        if passes and steady:
            self.costs.record_draft(model_batch, seconds / passes)
        if longest:
            self.stats.draft_seconds += seconds
        if self._step_yield is not None and longest:
            # A steady drafting step's cost (the first draft after a prompt catches up on all of it
            # once, which says nothing about the steps to come); lookups cost what they took.
            if passes:
                t = self.costs.draft_step_seconds(model_batch)
                self._step_yield[2] = passes * (t if t is not None else DRAFT_COST_GUESS * self.costs.step_seconds(1))
            else:
                self._step_yield[2] = seconds
        self._use(requests, self._select(drafts) if select else drafts)

    def _use(self, requests: list[Request], drafts: list[Draft]) -> None:
        for r, d in zip(requests, drafts):
            if d.tokens:
                r.draft_token_ids = list(d.tokens)
                self._drafts[r.request_id] = d

    def _select(self, drafts: list[Draft]) -> list[Draft]:
        if not any(d.tokens for d in drafts):
            return drafts
        batch = len(drafts)
        curve = self.costs.step_curve(batch, batch + sum(len(d.tokens) for d in drafts), batch)
        if curve is None or any(t is None for t in curve):
            return drafts
        return select_drafts(drafts, curve)

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
        if self._step_yield is not None:
            self._step_yield[1] += sum(accepted[i] for i in shared)
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

    def record_step(self, rows: int, seconds: float, target_seconds: float, batch: Optional[int] = None) -> None:
        """A step's target rows, its seconds after drafting, the target pass's share of them, and the
        number of sequences it computed."""
        self.costs.record_target(rows, seconds, batch)
        if self._step_yield is not None:
            # A probe (the first drafting step after plain ones) weighs more: while drafting is off,
            # probes are the only news of a sequence turning predictable again.
            self.costs.record_yield(*self._step_yield, step_seconds=seconds, ema=0.5 if self._probed else 0.2)
            self._step_yield = None
        self.stats.target_steps += 1
        self.stats.target_seconds += target_seconds

    def release(self, request: Request) -> None:
        self._drafts.pop(request.request_id, None)
        self.own_policies.pop(request.request_id, None)
        self.drafter.release(request)

    @property
    def c(self) -> Optional[float]:
        """Draft step time / target step time at batch 1 (Leviathan's c), from the measurements."""
        t_draft = self.costs.draft_step_seconds(1)
        t_target = self.costs.step_seconds(1)
        return t_draft / t_target if t_draft and t_target else None


def select_drafts(drafts: list[Draft], curve: list[float]) -> list[Draft]:
    """Which draft tokens to verify. A token is accepted with about its cumulative confidence (the
    drafters' confidences are calibrated), and curve[n] is the measured time of a step with n draft
    rows on top of one row per sequence. A token is worth its row when its chance of acceptance beats
    the tokens that row's time would give plain decoding (curve[0] / batch seconds per token): taking
    tokens by falling cumulative confidence (a sequence's tokens in order), keep the count with the
    most expected tokens beyond that cost. Time already spent drafting is sunk and changes nothing here.
    On a CPU the curve is not a line (kernel builds change with the rows: AVX up to 8, AMX past that,
    dense products past the block kernel's limit in models.layers), so this is a budget for the whole
    batch rather than a per-token threshold. It looks at draft-side
    information only, so verification stays exact."""
    batch = len(drafts)
    candidates = []  # (cumulative confidence, position in its draft, sequence)
    for i, d in enumerate(drafts):
        cum = 1.0
        for j, c in enumerate(d.confidence):
            cum *= c
            candidates.append((cum, j, i))
    candidates.sort(key=lambda t: (-t[0], t[1]))
    plain_rate = batch / curve[0]  # tokens per second without drafts
    best_n, best_surplus, expected = 0, 0.0, 0.0
    for n, t in enumerate(curve[1:len(candidates) + 1], start=1):
        expected += candidates[n - 1][0]
        surplus = expected - plain_rate * (t - curve[0])
        if surplus > best_surplus:
            best_n, best_surplus = n, surplus
    keep = [0] * batch
    for _, j, i in candidates[:best_n]:
        keep[i] = max(keep[i], j + 1)
    return [d if n == len(d.tokens) else Draft(d.tokens[:n], None if d.probs is None else d.probs[:n], d.confidence[:n])
            for d, n in zip(drafts, keep)]


def _between_keys(keys: list[int], x: int) -> bool:
    """Whether x lies strictly between the first and the last of the sorted keys."""
    return len(keys) >= 2 and keys[0] < x < keys[-1]


def _own_alpha(r: Request) -> Optional[float]:
    """A request's own acceptance estimate from its verify steps (None before the first)."""
    accepted = sum(r.spec_accepted)
    rejections = sum(a < n for a, n in zip(r.spec_accepted, r.spec_drafted))
    return accepted / (accepted + rejections) if accepted + rejections else None
