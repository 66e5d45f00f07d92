"""Speculative decoding inside the step loop, the controller's side: draft before scheduling, learn after
the step. Verification itself is a pure function (speculative/verify.py) the engine calls in between.

Each step, for the requests that are decoding:
  1. the draft-length policy says how far to draft; the cost model (what drafting steps of this batch
     size yielded per second, tokens over their measured step and draft-model time, against what plain
     steps of the batch size measure) says whether drafting pays, and when it does not the step is a plain
     decoding step that verifies only free drafts (prompt lookups), with a drafting step now and then
     to measure again; within a drafting step, only the sequences whose own recent acceptance says
     drafting pays for them draft (choice.py), the others decode plainly and are probed now and then;
  2. the drafter proposes; `select_drafts` keeps, for the whole batch, the draft tokens whose chance of
     acceptance (their calibrated confidence) beats what their rows cost on the step-time curve;
     `propose` returns them as the step's DraftBatch, which guided pruning may cut and the scheduler
     records in each request's ScheduledRequest (counted as more tokens to compute);
  3. after the target pass the engine verifies each scheduled draft (`verify.verify`) and asks
     `Scheduler.keep_rows` to forget the rejected rows; then `learn(StepResult)` updates, in one
     place, the policies, the per-sequence choice, the statistics and the drafter (`on_verified` for
     each verified draft, `observe` for every computed request).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ..drafters.base import Drafter, Proposal, TreeShape
from ..types import Draft, DraftBatch, Request, RequestStatus
from .calibration import Calibrator
from .choice import SequenceChoice
from .cost_model import DRAFT_COST_GUESS, FREE_SHAPE, CostModel
from .hierarchy import measured_chain
from .policies import DraftLengthPolicy
from .selection import select_drafts
from .stats import SpecStats
from .verify import Verified

AUTO_SHAPES = ("chain", "tree")  # what shape "auto" chooses among (registry.SHAPES)


@dataclass(frozen=True)
class VerifiedDraft:
    """One request's draft as the step verified it (after selection, guided pruning and scheduling)."""

    request: Request
    draft: Draft
    result: Verified


@dataclass(frozen=True)
class Observed:
    """Rows the target computed for a request this step (a prompt chunk, a plain or a verify step):
    num_new_tokens from position `start` (known tokens, then drafts), with the last hidden states of
    the rows that stayed valid (drafters that want them), after num_accepted accepted drafts."""

    request: Request
    start: int
    hidden: Optional[torch.Tensor]
    num_accepted: int
    num_new_tokens: int = 0

    @property
    def prompt_end(self) -> Optional[int]:
        """Where this step's prompt chunk ends (None: not a prompt chunk). Before the step's tokens are
        appended, a request without output tokens is still in its prompt."""
        return None if self.request.output_token_ids else self.start + self.num_new_tokens


@dataclass
class StepResult:
    """What a step did, for `SpeculativeDecoder.learn`."""

    verified: list[VerifiedDraft]
    observed: list[Observed]


@dataclass
class DraftingStep:
    """The batch's drafting this step, for CostModel.record_yield after the step."""

    batch: int
    tokens: int  # emitted: one per sequence, plus accepted drafts (added by verify)
    draft_seconds: float = 0.0
    probe: bool = False  # the first drafting step after plain ones
    shape: str = "chain"  # what was drafted: "chain" or "tree"; FREE_SHAPE: a plain step's free drafts


# How many extra rows a step's "could any draft pay?" check looks along the cost curve (two AVX-512
# row groups past a batch of 16; the scan runs every step).
MAX_PAYING_ROWS = 32


class SpeculativeDecoder:
    def __init__(self, drafter: Drafter, make_policy: Callable[[], DraftLengthPolicy], fallback: bool = True,
                 retry_every: int = 4, retry_max: int = 16, prior_alpha: float = 0.5, shape: str = "chain",
                 tree: Optional[TreeShape] = None, explore_every: int = 8, plain_every: int = 8):
        self.drafter, self.make_policy, self.fallback = drafter, make_policy, fallback
        # registry.SHAPES: "chain", "tree" (drafters that make trees), "auto" (chosen by measured yields)
        self.shape, self.tree = (shape if drafter.makes_trees else "chain"), tree or TreeShape()
        self.explore_every, self._auto_steps = explore_every, 0
        self.policy = make_policy()  # shared by the batch, as BASS adapts one length for all
        # A weak prior so the first steps already weigh drafting against plain decoding.
        self.costs = CostModel(prior_alpha=prior_alpha)
        self.calibrator: Optional[Calibrator] = None  # set by the engine: the cost model's start-up calibration
        self.stats = SpecStats()
        # After retry plain steps in a row, one drafting step measures again whether drafting pays;
        # retry starts at retry_every and doubles (up to retry_max) while those probes find it does not
        # (so at worst one losing drafting step every retry_max steps: a few percent of a run at most).
        self.retry_every, self.retry_max = retry_every, retry_max
        self._retry = retry_every
        # which sequences a drafting step drafts for
        self.choice = SequenceChoice(self.costs, prior_alpha, retry_every, retry_max)
        self._probed = False
        self._since_spec = 0
        # While drafting pays, one plain step in `plain_every` re-measures plain steps: the machine's
        # speed drifts within seconds on a shared VM, and a plain-step time measured before a long run
        # of drafting steps made them look better than they were (docs/decisions.md#cost-model).
        self.plain_every, self._since_plain = plain_every, 0
        self._step: Optional[DraftingStep] = None  # this step's shared drafting, until record_step
        self._free_skipped = 0  # plain steps in a row that left free drafts out (_free_drafts_pay)
        self._batch = 0  # the running sequences that may speculate, at the last propose
        self._prefills: dict[str, bool] = {}  # request id -> whether the draft follows its prompt's chunks

    @property
    def wants_hidden_states(self) -> bool:
        """Whether the target pass must return its last hidden states (for the drafter's observe)."""
        return self.drafter.wants_hidden_states

    @property
    def wants_span_argmax(self) -> bool:
        """Whether verification must return the target's greedy token after every span row (learn's
        observe_span, for lookahead decoding)."""
        return self.drafter.wants_span_argmax

    def reset_stats(self) -> None:
        self.stats = SpecStats()
        self.drafter.reset_report()

    # --- before scheduling ----------------------------------------------------------------------
    def propose(self, running: list[Request], prompt_rows: int = 0, waiting: int = 0) -> DraftBatch:
        """This step's drafts for the running requests that decode this step and should draft (only
        drafts with tokens). prompt_rows: the prompt tokens the step will also carry
        (Scheduler.prompt_rows_next), on top of which the selection prices draft rows. waiting: the
        requests not admitted yet, which will decode beside these."""
        drafts: DraftBatch = {}
        # Seeded sampled requests draft as the others do: their output is the one regular decoding gives
        # with their seed whatever was drafted (sampling/seeded.py), so the batch's measured costs may
        # decide their drafts too. (Decided apart, from the calibration alone, a batch of 16 seeded
        # requests ran at half regular decoding's speed: docs/decisions.md#seeded-batch.)
        # the batch the step's new sequences will decode in (learn's prefill choice)
        self._batch = waiting + sum(1 for r in running if r.params.speculative is not False)
        shared = [r for r in running if _decoding(r) and r.params.speculative is not False]
        if not shared:
            return drafts
        k = self.policy.draft_len()
        batch = len(shared)
        if self.fallback and not self._rows_can_pay(batch):
            # Not even a certain draft token would pay for its row at this batch size: a bare plain
            # step, without the draft pass, lookups or probes that the selection would all cut.
            self._plain_step(drafts, shared, None)
            return drafts
        if self.fallback and self._since_spec < self._retry:
            # Draft when drafting steps at this batch size have been paying; before any has been
            # measured, when the acceptance rate predicts it pays. After a run of plain steps, one
            # drafting step to measure again (conditions change along a sequence).
            pays = self.costs.drafting_pays(batch)
            if self.shape == "auto" and not self.costs.best_shape(batch, AUTO_SHAPES)[1] and pays is not None:
                pays = True  # a shape not measured at this batch size yet: measure it once
            if pays is None:
                best = self.costs.best_len(batch, k)
                k = k if best is None else best
            elif not pays:
                k = 0
            if self._probed:
                self._retry = self.retry_every if k else min(2 * self._retry, self.retry_max)
                self._probed = False
            refresh = bool(k) and pays is True and self._since_plain >= self.plain_every
            if k == 0 or refresh:
                # refresh: a bare plain step, as free drafts' rows would spoil its timing
                self._plain_step(drafts, shared, None if refresh else self.policy.draft_len(), prompt_rows)
                self._since_spec += not refresh
                return drafts
        else:
            self._probed = self.fallback and self._since_spec > 0
        self._since_spec = 0
        self._since_plain += 1
        # Drafting stops where a token is unlikely enough not to pay for its verify row and draft step
        # at the rate a batch's second row costs; `_select` then cuts along the measured cost curve.
        gate = self.costs.break_even_confidence(batch) if self.fallback else None
        drafting = shared if gate is None else self.choice.worth_drafting(shared, gate, self._probed)
        if not drafting:  # no sequence expected to pay for its draft: a plain step
            self._plain_step(drafts, shared, k, prompt_rows)
            return drafts
        floors = [c for c in (self.policy.min_confidence, gate) if c is not None]
        shape = self._pick_shape(batch)
        # the step's yield counts every shared sequence (those not drafted for emit their one token)
        self._step = DraftingStep(batch, batch, probe=self._probed, shape=shape)
        self._draft(drafts, drafting, k, max(floors) if floors else None, select=self.fallback, shape=shape,
                    batch=batch, prompt_rows=prompt_rows)
        return drafts

    def _plain_step(self, out: DraftBatch, shared: list[Request], free_len: Optional[int], prompt_rows: int = 0) -> None:
        """A step without model drafts for the shared batch; free drafts (lookups) of up to free_len
        tokens are still verified where they pay (None: none, a bare plain step)."""
        self.stats.fallback_steps += 1
        self.stats.speculating = False
        self._since_plain = 0
        if free_len is None or not self._free_drafts_pay(len(shared)):
            return
        t0 = time.perf_counter()
        if (proposal := self.drafter.propose_free(shared, free_len)) is not None:
            drafts = self._select([within(d, draft_room(r)) for d, r in zip(proposal.drafts, shared)],
                                  prompt_rows=prompt_rows)
            if any(d.tokens for d in drafts):  # measured as a step of the "free" shape (record_step)
                self._step = DraftingStep(len(shared), len(shared), time.perf_counter() - t0, shape=FREE_SHAPE)
            _use(out, shared, drafts)

    def _free_drafts_pay(self, batch: int) -> bool:
        """Whether plain steps at this batch size verify free drafts: unless the steps that did yielded
        fewer tokens per second than bare plain steps (in a batch of 8 on 2 cores the rows of lookups
        that mostly miss cost more than they gain: docs/decisions.md#free-drafts); then one plain step
        in `explore_every` verifies them again, to measure."""
        if self.costs.free_drafts_pay(batch) is not False:
            return True
        self._free_skipped = self._free_skipped + 1
        if self._free_skipped >= self.explore_every:
            self._free_skipped = 0
            return True
        return False

    def _pick_shape(self, batch: int) -> str:
        """Chain or tree for this drafting step: as configured, or ("auto") the shape whose drafting
        steps at this batch size have yielded the most tokens per second, the other one re-measured
        every `explore_every` drafting steps (which wins flips with the batch and the text)."""
        if self.shape != "auto":
            return self.shape
        best, measured = self.costs.best_shape(batch, AUTO_SHAPES)
        self._auto_steps += 1
        if measured and self._auto_steps % self.explore_every == 0:
            return next(s for s in AUTO_SHAPES if s != best)
        return best

    def _draft(self, out: DraftBatch, requests: list[Request], k: int, min_confidence: Optional[float], select: bool,
               shape: str, batch: int, prompt_rows: int = 0) -> None:
        """shape: "chain" or "tree". batch: the sequences the step decodes (the drafting ones and those
        the per-sequence choice leaves plain), which the selection prices rows at, on top of the step's
        prompt_rows."""
        room = [draft_room(r) for r in requests]
        k = min(k, max(room))
        if k <= 0:  # every request ends within this step: nothing to draft
            self._step = None
            return
        if self.fallback:
            self.drafter.set_catchup_price(self.costs.catchup_price(batch))
        t0 = time.perf_counter()
        proposal: Proposal = self.drafter.propose(requests, k, min_confidence, self.tree if shape == "tree" else None)
        seconds = time.perf_counter() - t0
        if proposal.catchup_seconds:
            self.costs.record_catchup(proposal.catchup_rows, proposal.catchup_seconds)
        # Draft-model passes only: a step whose drafts all came from lookups ran none, and timing it as
        # draft steps would drag the per-step estimate (and so every drafting decision) towards zero.
        passes, model_batch = proposal.model_passes, proposal.model_batch
        # Time drafting only in steady state: after a prompt, plain steps or a probe the drafter first
        # catches up on every token it missed, a one-off that is not what a draft step costs.
        steady = proposal.catchup_rows <= model_batch * (k + 1)
        if passes and steady:
            self.costs.record_draft(model_batch, seconds / passes)
        elif passes:  # its catch-up included: what a steady step costs at most
            self.costs.cap_draft(model_batch, seconds / passes)
        if proposal.longest:
            self.stats.draft_seconds += seconds
            if self._step is not None:
                # A steady drafting step's cost plus the catch-up it paid beyond a steady step's rows
                # (a prompt the draft did not follow): paid once, but paid by this step; left out, auto
                # drafted at batch 4-8 where every catch-up of a prompt cost more than the drafts gave
                # (docs/decisions.md#catchup-price). Not a probe's: its catch-up of the plain steps
                # before it is the one-off of switching drafting back on; charged to the probe, it made
                # every probe lose and kept drafting off for good (docs/decisions.md#probe-catchup).
                # Lookups cost what they took.
                if passes:
                    t = self.costs.draft_step_seconds(model_batch)
                    t = t if t is not None else DRAFT_COST_GUESS * self.costs.step_seconds(1)
                    once = 0.0 if steady or self._step.probe else max(0.0, proposal.catchup_seconds - t)
                    self._step.draft_seconds = passes * t + once
                else:
                    self._step.draft_seconds = seconds
        drafts = [within(d, n) for d, n in zip(proposal.drafts, room)]
        _use(out, requests, self._select(drafts, batch, prompt_rows) if select else drafts)

    def _select(self, drafts: list[Draft], batch: Optional[int] = None, prompt_rows: int = 0) -> list[Draft]:
        """Cut the drafts along the step-time curve of the step's whole batch (default: the drafts'
        sequences): priced as a batch of their own, a step's few drafting sequences put rows at batch
        1's price into steps of 8, where a row costs several times more (docs/decisions.md#cost-model)."""
        if not any(d.tokens for d in drafts):
            return drafts
        batch = batch or len(drafts)
        # the step's rows before drafts: its decodes and the prompt chunk riding with them (drafts
        # priced without the chunk made mixed steps far longer than planned)
        base = batch + prompt_rows
        curve = self.costs.step_curve(base, base + sum(len(d.tokens) for d in drafts), batch)
        if curve is None or any(t is None for t in curve):
            return drafts
        plain = curve[0] if base == batch else self.costs.step_seconds(batch, batch)
        return select_drafts(drafts, curve, batch=batch, plain_seconds=plain)

    # --- after the step: everything learned from it --------------------------------------------
    def learn(self, step: "StepResult") -> None:
        """Everything a step teaches, in one place: the drafter's span callback (lookahead), the
        draft-length policies, the per-sequence choice, the acceptance and statistics (the requests'
        spec_* statistics too), each verified draft's drafter (`on_verified`), then every computed
        request's rows (`observe`), and the step's prompt chunks (`prefill`, for a draft model's own KV).
        The engine calls it after verification and roll-back, before the step's tokens are appended;
        only the step's timing comes later (`record_step`)."""
        if step.verified:
            self._learn_verified(step.verified)
        for o in step.observed:
            self.drafter.observe(o.request, o.start, o.hidden, o.num_accepted)
        # The draft's prefill, for requests that arrived alone in the engine and will draft (decided at
        # the prompt's first chunk: not with speculation off, nor where a new sequence would not draft).
        # One that arrives beside other sequences catches its draft up at its first drafting step, as
        # before: computed for every prompt, the draft's prompts cost auto 10-12% at batch 8-16, where
        # most sequences never draft (docs/decisions.md#draft-prefill).
        chunks = []
        for o in step.observed:
            end, rid = o.prompt_end, o.request.request_id
            if end is None or o.request.params.speculative is False:
                continue
            if rid not in self._prefills:
                self._prefills[rid] = self._batch <= 1 and self._new_sequences_draft(1)
            if self._prefills[rid]:
                chunks.append((o.request, end))
        if chunks:
            t0 = time.perf_counter()
            rows = self.drafter.prefill(chunks)
            self.costs.record_catchup(rows, time.perf_counter() - t0)

    def _rows_can_pay(self, batch: int) -> bool:
        """CostModel.rows_can_pay over the rows the policy's draft length asks for at this batch size."""
        return self.costs.rows_can_pay(batch, min(batch * max(self.policy.draft_len(), 1), MAX_PAYING_ROWS))

    def _new_sequences_draft(self, batch: int) -> bool:
        """Whether a sequence starting now would draft in a batch of `batch`, by the checks `propose`
        makes: a draft row can pay at the batch size, drafting steps there have not been measured to
        lose, and a sequence without acceptance of its own (the batch's alpha stands in for it, as in
        SequenceChoice.worth_drafting) clears the per-sequence gate."""
        if not self.fallback:
            return True
        c = self.costs
        if not self._rows_can_pay(batch):
            return False
        if c.drafting_pays(batch) is False:
            return False
        gate = c.break_even_confidence(batch)
        return gate is None or (c.alpha if c.alpha is not None else self.choice.prior_alpha) >= gate

    def _learn_verified(self, verified: list["VerifiedDraft"]) -> None:
        if self.drafter.wants_span_argmax:
            for x in verified:
                self.drafter.observe_span(x.request, x.draft, x.result.argmax, list(x.result.path))
        accepted = [x.result.num_accepted for x in verified]
        drafted = [x.result.num_drafted for x in verified]
        depths = [x.result.depth for x in verified]
        # the draft-length policy and the per-depth statistics see a tree as its deepest chain, with
        # the accepted path's confidences
        confidences = [[x.draft.confidence[j] for j in x.result.path] + ([0.0] if len(x.result.path) < x.result.depth else [])
                       if x.draft.is_tree else x.draft.confidence for x in verified]
        rejections = sum(a < n for a, n in zip(accepted, depths))
        if self._step is not None:
            self._step.tokens += sum(accepted)
        self.policy.update(depths, accepted, confidences)
        for x, a, d in zip(verified, accepted, depths):
            self.choice.record(x.request.request_id, a, d)
        self.costs.record_acceptance(sum(accepted), rejections)
        s = self.stats
        s.spec_steps += 1
        s.speculating = True
        s.drafted += sum(drafted)
        s.accepted += sum(accepted)
        s.rejections += rejections
        s.record_positions(depths, accepted)
        trees = [i for i, x in enumerate(verified) if x.draft.is_tree]
        s.tree_spans += len(trees)
        s.tree_nodes += sum(drafted[i] for i in trees)
        for x, a, n in zip(verified, accepted, drafted):
            r = x.request
            r.spec_drafted.append(n)
            r.spec_accepted.append(a)
            r.spec_origin.append(x.draft.origin)
            self.drafter.on_verified(r, x.draft, a)

    def fork(self, parent: Request, child: Request) -> None:
        self.drafter.fork(parent, child)

    def record_step(self, rows: int, seconds: float, target_seconds: float, batch: int, decode_seqs: int,
                    decode_tokens: int) -> None:
        """A step's target rows, its seconds after drafting, the target pass's share of them, the
        number of sequences it computed, and of those the decoding ones and the tokens they emitted."""
        self.costs.record_target(rows, seconds, batch)
        if self.calibrator is not None:
            self.calibrator.check()
        if self._step is not None:
            # A probe (the first drafting step after plain ones) weighs more: while drafting is off,
            # probes are the only news of a sequence turning predictable again.
            st = self._step
            self.costs.record_yield(st.batch, st.tokens, st.draft_seconds, step_seconds=seconds,
                                    ema=0.5 if st.probe else 0.2, shape=st.shape)
            self._step = None
        s = self.stats
        s.target_steps += 1
        s.target_seconds += target_seconds
        s.decode_seq_steps += decode_seqs
        s.decode_tokens += decode_tokens

    def abandon_step(self) -> None:
        """Forget the drafting of a step that never completed (aborted): it must not be measured."""
        self._step = None

    def release(self, request: Request) -> None:
        self.choice.release(request.request_id)
        self._prefills.pop(request.request_id, None)
        self.drafter.release(request)

    def hierarchy(self) -> dict:
        """alpha, c and k per drafter pair and the gains they predict (speculative/hierarchy.measured_chain);
        {} before anything was verified."""
        if not self.stats.spec_steps:
            return {}
        return measured_chain(self.stats, self.costs, self.drafter.report(), self.c)

    @property
    def c(self) -> Optional[float]:
        """Draft step time / target step time at batch 1 (Leviathan's c), from the measurements."""
        t_draft = self.costs.draft_step_seconds(1)
        t_target = self.costs.step_seconds(1)
        return t_draft / t_target if t_draft and t_target else None


def draft_room(r: Request) -> int:
    """Draft tokens r can still use: a verify step emits its accepted drafts and one token more, so a
    draft token past max_tokens - 1 - (tokens generated) would be computed, verified and thrown away
    (docs/decisions.md#draft-room)."""
    return r.params.max_tokens - len(r.output_token_ids) - 1


def within(d: Draft, room: int) -> Draft:
    """d without its tokens deeper than `room` (a tree keeps its shallower nodes)."""
    if not d.tokens or len(d.tokens) <= room and not d.is_tree:
        return d
    return d.subset([j for j, depth in enumerate(d.depths()) if depth <= room])


def _use(out: DraftBatch, requests: list[Request], drafts: list[Draft]) -> None:
    """Into the step's batch: the drafts with tokens."""
    for r, d in zip(requests, drafts):
        if d.tokens:
            out[r.request_id] = d


def _decoding(r: Request) -> bool:
    """Whether r decodes this step: its prompt computed, one token or more to compute. More than one:
    tokens appended without a pass (grammar-forced ones, fast-forwarded), which the verify span then
    computes before the draft, like one-hot drafts accepted with certainty (drafters that need the
    target's state at the last token, EAGLE, skip such a step: they have it only for computed rows)."""
    return r.status == RequestStatus.RUNNING and r.past_prompt and r.num_tokens > r.num_computed_tokens
