"""Speculative decoding inside the step loop: draft before scheduling, verify after the target pass.

Each step, for the requests that are decoding:
  1. the draft-length policy says how far to draft; the cost model (what drafting steps of this batch
     size yielded per second, tokens over their measured step and draft-model time, against what plain
     steps of the batch size measure) says whether drafting pays, and when it does not the step is a plain
     decoding step that verifies only free drafts (prompt lookups), with a drafting step now and then
     to measure again; within a drafting step, only the sequences whose own recent acceptance says
     drafting pays for them draft (choice.py), the others decode plainly and are probed now and then;
  2. the drafter proposes; `select_drafts` keeps, for the whole batch, the draft tokens whose chance of
     acceptance (their calibrated confidence) beats what their rows cost on the step-time curve; they
     become `request.draft` (the one place a draft lives), which the scheduler counts as more tokens
     to compute;
  3. after the target pass, `verify` turns each request's 1 + k logits rows into accepted tokens plus
     one more (modified rejection sampling, or prefix match for greedy) and consumes the draft; the
     engine asks `Scheduler.rollback` to forget the rejected rows and the drafter to `observe`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ..drafters.base import Drafter, Proposal, TreeShape
from ..sampling.rejection import rejection_sample, verify_greedy
from ..sampling.sampler import warp_logits
from ..sampling.seeded import verify_by_sampling
from ..sampling.tree import children_table, verify_tree, verify_tree_greedy
from ..types import Draft, Request, RequestStatus, TokenOrigin
from .choice import SequenceChoice
from .cost_model import DRAFT_COST_GUESS, CostModel
from .hierarchy import measured_chain
from .policies import DraftLengthPolicy
from .selection import select_drafts
from .stats import SpecStats

AUTO_SHAPES = ("chain", "tree")  # what shape "auto" chooses among (registry.SHAPES)
MAX_TREE_DEPTH = 32  # the deepest draft any policy asks for (BASS's l_limit)
# the widest node a drafter makes (suffix drafting: 1 / MIN_PROB children; lookahead: its guesses and
# the window's spine below the root): with the tree's top_k, the sampled verifier's uniforms grid
MAX_TREE_WIDTH = 16


@dataclass(frozen=True)
class Verified:
    """One request's verify span, verified."""

    num_drafted: int
    num_accepted: int
    tokens: list[int]  # to emit: the accepted drafts, then one token from the target
    # the span rows that stay (row 0: the last known token; draft token j is row j + 1): the root and
    # the accepted path, whose logits rows gave `tokens`. A chain's are 0..num_accepted; a tree's path
    # may skip rows, whose KV then moves up (Scheduler.keep_rows).
    rows: tuple[int, ...] = ()
    depth: int = 0  # the draft's depth (a chain's length)
    origin: TokenOrigin = TokenOrigin.DRAFT  # who proposed the accepted drafts (the last token: the target)

    @property
    def origins(self) -> list[TokenOrigin]:
        """Who proposed each of `tokens`."""
        return [self.origin] * self.num_accepted + [TokenOrigin.TARGET]

    @property
    def num_rejected(self) -> int:
        return self.num_drafted - self.num_accepted


@dataclass
class DraftingStep:
    """The shared (unseeded) batch's drafting this step, for CostModel.record_yield after the step."""

    batch: int
    tokens: int  # emitted: one per sequence, plus accepted drafts (added by verify)
    draft_seconds: float = 0.0
    probe: bool = False  # the first drafting step after plain ones
    shape: str = "chain"  # what was drafted: "chain" or "tree"


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
        # A seeded sampled request's output does not depend on its drafts at all (verify: sampling/
        # seeded.py). It still gets a policy of its own, and its fallback looks only at its own
        # acceptance and the start-up calibration at the batch of its own samples, so that what it
        # drafts, and costs, does not swing with the batch's other requests or live timings.
        self.own_policies: dict[str, DraftLengthPolicy] = {}
        # A weak prior so the first steps already weigh drafting against plain decoding.
        self.costs = CostModel(prior_alpha=prior_alpha)
        self.stats = SpecStats()
        # After retry plain steps in a row, one drafting step measures again whether drafting pays;
        # retry starts at retry_every and doubles (up to retry_max) while those probes find it does not
        # (so at worst one losing drafting step every retry_max steps: a few percent of a run at most).
        self.retry_every, self.retry_max = retry_every, retry_max
        self._retry = retry_every
        # which sequences a drafting step drafts for, and a seeded request's own draft length
        self.choice = SequenceChoice(self.costs, prior_alpha, retry_every, retry_max)
        self._probed = False
        self._since_spec = 0
        # While drafting pays, one plain step in `plain_every` re-measures plain steps: the machine's
        # speed drifts by tens of percent within seconds on a shared VM, and a plain-step time measured
        # before a long run of drafting steps made them look better than they were (forced PAD at batch
        # 4 drafted 40 steps in a row at 0.95x the tokens/s of the plain steps around them).
        self.plain_every, self._since_plain = plain_every, 0
        self._step: Optional[DraftingStep] = None  # this step's shared drafting, until record_step

    @property
    def wants_hidden_states(self) -> bool:
        """Whether the target pass must return its last hidden states (for the drafter's observe)."""
        return self.drafter.wants_hidden_states

    @staticmethod
    def _seeded(r: Request) -> bool:
        return r.seed is not None and not r.params.greedy

    def reset_stats(self) -> None:
        self.stats = SpecStats()
        self.drafter.reset_report()

    # --- before scheduling ----------------------------------------------------------------------
    def propose(self, running: list[Request], prompt_rows: int = 0) -> None:
        """Set `request.draft` for the running requests that decode this step and should draft.
        prompt_rows: the prompt tokens the step will also carry (Scheduler.prompt_rows_next), on top of
        which the selection prices draft rows."""
        decoding = [r for r in running if _decoding(r) and r.params.speculative is not False]
        shared = [r for r in decoding if not self._seeded(r)]
        # Seeded requests with the same length (and threshold) draft together: one draft pass each
        # step for the lot, not one per request (a request's draws come from its own generator).
        same_len: dict[tuple, list[Request]] = {}
        for r in decoding:
            if self._seeded(r):
                policy = self.own_policies.setdefault(r.request_id, self.make_policy())
                k = policy.draft_len()
                floor = policy.min_confidence
                if self.fallback:  # from the request's own acceptance and the fixed calibration only
                    k = self.choice.own_len(r, k)
                    # and drafting stops where a token is unlikely enough not to pay for its verify row,
                    # as the shared path's gate, priced on the calibration at its own samples' batch
                    gate = self.costs.break_even_confidence(r.params.num_samples, calibrated_only=True)
                    floor = max((c for c in (floor, gate) if c is not None), default=None)
                if k:
                    same_len.setdefault((k, floor), []).append(r)
        for (k, min_confidence), group in same_len.items():
            self._draft(group, k, min_confidence)
        if not shared:
            return
        k = self.policy.draft_len()
        batch = len(shared)
        if self.fallback and not self.costs.rows_can_pay(batch, min(batch * max(k, 1), MAX_PAYING_ROWS)):
            # Not even a certain draft token would pay for its row at this batch size: a bare plain
            # step, without the draft pass, lookups or probes that the selection would all cut.
            self._plain_step(shared, None)
            return
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
                self._plain_step(shared, None if refresh else self.policy.draft_len(), prompt_rows)
                self._since_spec += not refresh
                return
        else:
            self._probed = self.fallback and self._since_spec > 0
        self._since_spec = 0
        self._since_plain += 1
        # Drafting stops where a token is unlikely enough not to pay for its verify row and draft step
        # at the rate a batch's second row costs; `_select` then cuts along the measured cost curve.
        gate = self.costs.break_even_confidence(batch) if self.fallback else None
        drafting = shared if gate is None else self.choice.worth_drafting(shared, gate, self._probed)
        if not drafting:  # no sequence expected to pay for its draft: a plain step
            self._plain_step(shared, k, prompt_rows)
            return
        floors = [c for c in (self.policy.min_confidence, gate) if c is not None]
        shape = self._pick_shape(batch)
        # the step's yield counts every shared sequence (those not drafted for emit their one token)
        self._step = DraftingStep(batch, batch, probe=self._probed, shape=shape)
        self._draft(drafting, k, max(floors) if floors else None, select=self.fallback, shape=shape, batch=batch,
                    prompt_rows=prompt_rows)

    def _plain_step(self, shared: list[Request], free_len: Optional[int], prompt_rows: int = 0) -> None:
        """A step without model drafts for the shared batch; free drafts (lookups) of up to free_len
        tokens are still verified where they pay (None: none, a bare plain step)."""
        self.stats.fallback_steps += 1
        self.stats.speculating = False
        self._since_plain = 0
        if free_len is not None and (proposal := self.drafter.propose_free(shared, free_len)) is not None:
            self._use(shared, self._select(proposal.drafts, prompt_rows=prompt_rows))

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

    def _draft(self, requests: list[Request], k: int, min_confidence: Optional[float], select: bool = False,
               shape: Optional[str] = None, batch: Optional[int] = None, prompt_rows: int = 0) -> None:
        """shape: "chain" or "tree"; None: a seeded group's, which must not depend on live timings (a tree
        only where trees are forced). batch: the sequences the step decodes (the drafting ones and
        those the per-sequence choice leaves plain), which the selection prices rows at, on top of the
        step's prompt_rows."""
        shape = shape or ("tree" if self.shape == "tree" else "chain")
        t0 = time.perf_counter()
        proposal: Proposal = self.drafter.propose(requests, k, min_confidence, self.tree if shape == "tree" else None)
        seconds = time.perf_counter() - t0
        # Draft-model passes only: a step whose drafts all came from lookups ran none, and timing it as
        # draft steps would drag the per-step estimate (and so every drafting decision) towards zero.
        passes, model_batch = proposal.model_passes, proposal.model_batch
        # Time drafting only in steady state: after a prompt, plain steps or a probe the drafter first
        # catches up on every token it missed, a one-off that is not what a draft step costs.
        steady = proposal.catchup_rows <= model_batch * (k + 1)
        if passes and steady:
            self.costs.record_draft(model_batch, seconds / passes)
        if proposal.longest:
            self.stats.draft_seconds += seconds
            if self._step is not None:
                # A steady drafting step's cost (the first draft after a prompt catches up on all of
                # it once, which says nothing about the steps to come); lookups cost what they took.
                if passes:
                    t = self.costs.draft_step_seconds(model_batch)
                    self._step.draft_seconds = passes * (t if t is not None else DRAFT_COST_GUESS * self.costs.step_seconds(1))
                else:
                    self._step.draft_seconds = seconds
        self._use(requests, self._select(proposal.drafts, batch, prompt_rows) if select else proposal.drafts)

    @staticmethod
    def _use(requests: list[Request], drafts: list[Draft]) -> None:
        for r, d in zip(requests, drafts):
            if d.tokens:
                r.draft = d

    def _select(self, drafts: list[Draft], batch: Optional[int] = None, prompt_rows: int = 0) -> list[Draft]:
        """Cut the drafts along the step-time curve of the step's whole batch (default: the drafts'
        sequences). Pricing a step's few drafting sequences as a batch of their own put rows at batch
        1's price (0.7 ms, a sixth of a plain token) into steps of 8 (1.3-1.7 ms, about a plain token
        each there)."""
        if not any(d.tokens for d in drafts):
            return drafts
        batch = batch or len(drafts)
        # the step's rows before drafts: its decodes and the prompt chunk riding with them (10 draft
        # rows rode beside 16 prompt tokens and 6 decodes, 35 ms for a 22 ms step, before this)
        base = batch + prompt_rows
        curve = self.costs.step_curve(base, base + sum(len(d.tokens) for d in drafts), batch)
        if curve is None or any(t is None for t in curve):
            return drafts
        plain = curve[0] if base == batch else self.costs.step_seconds(batch, batch)
        return select_drafts(drafts, curve, batch=batch, plain_seconds=plain)

    # --- after the target pass ------------------------------------------------------------------
    def verify(self, requests: list[Request], logits: list[torch.Tensor], generators: list) -> list[Verified]:
        """requests with drafts; logits[i] [1 + k_i, vocab] for request i (its StepOutput rows). Consumes
        each request's draft; returns, per request, the accepted drafts plus one token from the target."""
        drafts = [r.draft for r in requests]
        emitted: list[list[int]] = [[] for _ in requests]
        paths: list[list[int]] = [[] for _ in requests]  # accepted draft tokens (indices)
        # seeded sampled requests draw the target's own tokens and follow their draft while it matches
        # (sampling/seeded.py): their output is regular decoding's for the seed, whatever was drafted
        seeded = [i for i, r in enumerate(requests) if self._seeded(r)]
        for i in seeded:
            paths[i], nxt = verify_by_sampling(logits[i], drafts[i], requests[i].params, generators[i])
            emitted[i] = [drafts[i].tokens[j] for j in paths[i]] + [nxt]
        chains = [i for i, d in enumerate(drafts) if not d.is_tree and not self._seeded(requests[i])]
        trees = [i for i, d in enumerate(drafts) if d.is_tree and not self._seeded(requests[i])]
        greedy = [i for i in chains if requests[i].params.greedy]
        sampled = [i for i in chains if not requests[i].params.greedy]
        if greedy:
            for i, (a, nxt) in zip(greedy, verify_greedy([logits[i] for i in greedy], [drafts[i].tokens for i in greedy])):
                paths[i] = list(range(a))
                emitted[i] = drafts[i].tokens[:a] + [nxt]
        if sampled:
            K = max(len(drafts[i].tokens) for i in sampled)
            V = logits[sampled[0]].shape[-1]
            dev = logits[sampled[0]].device
            num = torch.tensor([len(drafts[i].tokens) for i in sampled], device=dev)
            tokens = torch.zeros(len(sampled), K, dtype=torch.long, device=dev)
            for row, i in enumerate(sampled):
                tokens[row, :len(drafts[i].tokens)] = torch.tensor(drafts[i].tokens, device=dev)
            p = torch.zeros(len(sampled), K + 1, V, device=dev)
            draft_probs = [drafts[i].probs for i in sampled]
            # None: a deterministic draft, q = one-hot (all None: rejection_sample takes q = None)
            q = None if all(d is None for d in draft_probs) else torch.zeros(len(sampled), K, V, device=dev)
            for row, i in enumerate(sampled):
                p[row, :len(logits[i])] = warp_logits(logits[i], requests[i].params)
                if q is not None and draft_probs[row] is not None:
                    q[row, :len(draft_probs[row])] = draft_probs[row]
                elif q is not None:
                    n = len(drafts[i].tokens)
                    q[row, torch.arange(n, device=dev), tokens[row, :n]] = 1.0
            n_acc, nxt = rejection_sample(p, q, tokens, num, [generators[i] for i in sampled])
            for row, i in enumerate(sampled):
                a = int(n_acc[row])
                paths[i] = list(range(a))
                emitted[i] = drafts[i].tokens[:a] + [int(nxt[row])]
        if trees:
            for i, path, nxt in self._verify_trees([requests[i] for i in trees], [logits[i] for i in trees],
                                                   [generators[i] for i in trees], trees):
                paths[i] = path
                emitted[i] = [drafts[i].tokens[j] for j in path] + [nxt]
        if self.drafter.wants_span_argmax:
            for r, d, lg, path in zip(requests, drafts, logits, paths):
                self.drafter.observe_span(r, d, lg.argmax(dim=-1).tolist(), path)
        accepted = [len(path) for path in paths]
        drafted = [len(d.tokens) for d in drafts]
        depths = [max(d.depths(), default=0) for d in drafts]
        # the draft-length policy and the per-depth statistics see a tree as its deepest chain, with
        # the accepted path's confidences
        confidences = [[d.confidence[j] for j in path] + ([0.0] if len(path) < depth else [])
                       if d.is_tree else d.confidence for d, path, depth in zip(drafts, paths, depths)]
        for r in requests:
            r.draft = None
        rejections = sum(a < n for a, n in zip(accepted, depths))
        shared = [i for i, r in enumerate(requests) if not self._seeded(r)]
        if self._step is not None:
            self._step.tokens += sum(accepted[i] for i in shared)
        if shared:
            self.policy.update([depths[i] for i in shared], [accepted[i] for i in shared], [confidences[i] for i in shared])
        for i, r in enumerate(requests):
            if self._seeded(r):
                self.own_policies[r.request_id].update([depths[i]], [accepted[i]], [confidences[i]])
            else:
                self.choice.record(r.request_id, accepted[i], depths[i])
        self.costs.record_acceptance(sum(accepted), rejections)
        s = self.stats
        s.spec_steps += 1
        s.speculating = True
        s.drafted += sum(drafted)
        s.accepted += sum(accepted)
        s.rejections += rejections
        s.record_positions(depths, accepted)
        s.tree_spans += len(trees)
        s.tree_nodes += sum(drafted[i] for i in trees)
        for r, a, n, d in zip(requests, accepted, drafted, drafts):
            r.spec_drafted.append(n)
            r.spec_accepted.append(a)
            r.spec_origin.append(d.origin)
        return [Verified(n, len(path), e, (0,) + tuple(j + 1 for j in path), depth, d.origin)
                for n, path, e, depth, d in zip(drafted, paths, emitted, depths, drafts)]

    def _verify_trees(self, requests: list[Request], logits: list[torch.Tensor], generators: list, index: list[int]):
        """Token-tree drafts (deterministic top-k children): the longest matching path for greedy
        requests, multi-candidate speculative sampling for sampled ones (sampling/tree.py). Yields
        (index[i], accepted path of draft indices, the target's next token)."""
        for greedy in (True, False):
            sel = [i for i, r in enumerate(requests) if r.params.greedy == greedy]
            if not sel:
                continue
            drafts = [requests[i].draft for i in sel]
            N = max(len(d.tokens) for d in drafts)
            V, dev = logits[sel[0]].shape[-1], logits[sel[0]].device
            tables = [children_table(d.parents) for d in drafts]
            W = max(t.shape[1] for t in tables)
            children = torch.full((len(sel), N + 1, W), -1, dtype=torch.long)
            tokens = torch.zeros(len(sel), N, dtype=torch.long)
            target = torch.zeros(len(sel), N + 1, V, device=dev)
            for row, (i, d, t) in enumerate(zip(sel, drafts, tables)):
                children[row, :t.shape[0], :t.shape[1]] = t
                tokens[row, :len(d.tokens)] = torch.tensor(d.tokens)
                n = len(d.tokens) + 1
                target[row, :n] = logits[i] if greedy else warp_logits(logits[i], requests[i].params)
            if greedy:
                paths, nxt = verify_tree_greedy(target, tokens.to(dev), children.to(dev))
            else:
                # the uniforms' grid is fixed per request (sampling/tree.py): the deepest draft a policy
                # asks for, the tree's width
                paths, nxt = verify_tree(target, None, tokens.to(dev), children.to(dev), [generators[i] for i in sel],
                                         max_depth=MAX_TREE_DEPTH, max_width=max(self.tree.top_k, MAX_TREE_WIDTH))
            for row, i in enumerate(sel):
                yield index[i], paths[row], int(nxt[row])

    def observe(self, request: Request, start: int, hidden: Optional[torch.Tensor], num_accepted: int) -> None:
        """The target computed rows for request from position start; hidden [valid rows, hidden] (for
        drafters that want it) of the rows that stayed valid."""
        self.drafter.observe(request, start, hidden, num_accepted)

    def fork(self, parent: Request, child: Request) -> None:
        self.drafter.fork(parent, child)

    def record_step(self, rows: int, seconds: float, target_seconds: float, batch: int, decode_seqs: int,
                    decode_tokens: int) -> None:
        """A step's target rows, its seconds after drafting, the target pass's share of them, the
        number of sequences it computed, and of those the decoding ones and the tokens they emitted."""
        self.costs.record_target(rows, seconds, batch)
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
        request.draft = None
        self.own_policies.pop(request.request_id, None)
        self.choice.release(request.request_id)
        self.drafter.release(request)

    def hierarchy(self) -> dict:
        """alpha, c and k per drafter pair and the gains they predict (spec/hierarchy.measured_chain);
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


def _decoding(r: Request) -> bool:
    """Whether r decodes this step: its prompt computed, one token or more to compute. More than one:
    tokens appended without a pass (grammar-forced ones, fast-forwarded), which the verify span then
    computes before the draft, like one-hot drafts accepted with certainty (drafters that need the
    target's state at the last token, EAGLE, skip such a step: they have it only for computed rows)."""
    return r.status == RequestStatus.RUNNING and r.past_prompt and r.num_tokens > r.num_computed_tokens
