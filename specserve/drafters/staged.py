"""Staged speculative decoding (Spector & Re 2023) and hierarchical drafting (the MIT 6.s898 report):
a draft model that is itself sped up by speculative decoding with a cheaper drafter, N levels deep.

`speculative={"method": "staged", "stages": ["draft", "ngram"]}`: stage 0 (a draft model) drafts for
the target; stage 1 (the n-gram model) drafts for stage 0. Each round, for every sequence still
drafting, the next stage proposes up to k2 tokens after the sequence and the draft so far; the stage
runs ONE pass over [its last draft token] + those proposals and keeps the proposals it would have
drafted itself, plus one token of its own (its argmax for greedy requests; for sampled ones, a
proposal y is kept with probability q(y), else a token is drawn from q with y removed, which is a
draw from q: speculative sampling with a deterministic draft). So the draft tokens are exactly what
the stage alone would draft (greedy), or drawn from exactly its distribution q (sampled; q is what
the target's verification sees), for fewer of its passes: the target's output stays what regular
decoding gives, whatever the lower stages propose.

Which stages can be staged: a model that scores a span of tokens in one pass (a standalone draft
model: any model file with the target's tokenizer, or "target" itself, whose alpha is 1 by
construction and makes a clean check of the gain formula). The EAGLE draft cannot: each of its rows
reads the feature the row before it predicted, so a span of proposed tokens takes one pass per token
anyway. The last stage may also be a free drafter ("ngram", "lookup"), proposing greedily.

Rolling back: a stage's KV rows stay valid up to the last token it kept (rows of rejected proposals
are overwritten by the next round), and after the target's verification up to the target's accepted
tokens (`observe`), as for the plain draft-model drafter; lower stages are told the same.
"""
from __future__ import annotations

import os
import time
from typing import Optional

import torch

from ..loading import resolve_model_path
from ..registry import MODELS
from ..sampling.sampler import draw, warp_logits
from ..types import Draft, Request, SamplingParams
from .base import Drafter, DrafterContext, Proposal
from .draft_model import DraftModelDrafter, _is_eagle, default_draft_path, load_model_drafter

FREE_STAGES = ("lookup", "ngram")  # drafters that propose without a model pass (the last stage only)
MODEL_STAGES = ("draft", "target")  # the spec's draft_model; the serving model itself
K2_START, K2_MAX = 4, 8  # a lower stage's proposal length: grown while all are kept (BASS), shrunk on a miss
_GREEDY = SamplingParams(temperature=0)  # lower stages propose greedily (deterministic drafts)


def build(spec, ctx: DrafterContext) -> Drafter:
    stages = list(spec.stages)
    if len(stages) < 2:
        raise ValueError(f"staged drafting needs at least two stages (a draft model and what drafts for it), got {stages}")
    models = [_model_stage(name, spec, ctx) for name in stages[:-1]]
    last = stages[-1]
    if last in FREE_STAGES:
        from ..registry import DRAFTERS
        helper: Drafter = DRAFTERS.get(last)(spec, ctx)
    else:
        helper = _model_stage(last, spec, ctx)
    for level in range(len(models) - 1, 0, -1):  # bottom up: level i drafts for level i - 1
        helper = StagedDrafter(models[level], helper, stages[level:])
    return StagedDrafter(models[0], helper, stages)


def _model_stage(name: str, spec, ctx: DrafterContext) -> DraftModelDrafter:
    if name in FREE_STAGES:
        raise ValueError(f"stage {name!r} has no model to run a proposal through: only the last stage may be "
                         f"{' or '.join(FREE_STAGES)}")
    if name == "target":
        path = ctx.target_path
    elif name == "draft":
        path = spec.draft_model or default_draft_path(ctx.target_path)
    else:
        path = name
    if not os.path.exists(path) and path in MODELS:  # a known model's name, as --model takes it (pulled if needed)
        path = resolve_model_path(path)
    if not os.path.exists(path):
        raise ValueError(f"stage {name!r}: no such model file or directory (a stage is one of "
                         f"{', '.join(MODEL_STAGES + FREE_STAGES)}, or a model path)")
    if _is_eagle(path):
        raise ValueError(f"stage {name!r} is an EAGLE draft ({path}), which cannot be staged: each of its rows reads the "
                         "feature its previous row predicted, so checking k proposals takes k passes; give a standalone "
                         "draft model (speculative={'draft_model': PATH}, a model with the target's tokenizer) or 'target'")
    return load_model_drafter(path, ctx, spec.draft_vocab, spec.draft_quant)


def without(q: torch.Tensor, token: int) -> torch.Tensor:
    """q [vocab] with `token` taken out, renormalised: after a deterministic proposal y was rejected
    (kept with probability q(y)), a draw from this makes the token a draw from q."""
    rest = q.clone()
    rest[token] = 0.0
    return rest / rest.sum()


class StagedDrafter(Drafter):
    def __init__(self, model: DraftModelDrafter, helper: Drafter, names: list[str]):
        self.model, self.helper, self.names = model, helper, names
        self.k2 = K2_START
        self.reset_report()

    def reset_report(self) -> None:
        # this level's pair with its helper: proposals made / kept, rounds that missed one, passes, seconds
        self.proposed = self.kept = self.misses = self.passes = 0
        # timings of batch-1 rounds only (c is a batch-1 ratio, as SpeculativeDecoder.c)
        self.passes_b1 = self.proposed_b1 = 0
        self.calls = 0  # propose calls: each one catch-up pass
        self.helper.reset_report()
        self.pass_seconds = self.helper_seconds = 0.0

    def report(self) -> dict:
        """Per stage pair, top down: [{stage, helper, alpha (the share of the helper's proposals this
        stage kept, geometric estimate), k (proposals per round), pass_seconds (this stage's model pass at
        batch 1), token_seconds (what one proposal cost the helper: its model pass if it is staged too,
        else its time per proposed token)}], the MIT report's alpha and c per pair."""
        alpha = self.kept / (self.kept + self.misses) if self.kept + self.misses else None
        lower = self.helper.report().get("stages", [])  # a staged helper's pairs below this one
        per_token = lower[0]["pass_seconds"] if lower else \
            (self.helper_seconds / self.proposed_b1 if self.proposed_b1 else None)
        mine = {"stage": self.names[0], "helper": self.names[1], "alpha": alpha,
                "k": self.proposed / self.passes if self.passes else None,
                "passes": self.passes + self.calls,  # every pass of this stage's model, catch-ups included
                "weight_bytes": self.model.weight_bytes,
                "pass_seconds": self.pass_seconds / self.passes_b1 if self.passes_b1 else None,
                "token_seconds": per_token}
        return {"stages": [mine] + lower}

    @torch.inference_mode()
    def propose(self, requests: list[Request], max_len: int, min_confidence: Optional[float] = None,
                tree=None) -> Proposal:
        m = self.model
        drafts = {r.request_id: Draft() for r in requests}
        live = [r for r in requests if max_len > 0 and m.reserve(r, r.num_tokens + max_len)]
        if not live:
            return Proposal([drafts[r.request_id] for r in requests])
        # Catch-up, as the plain draft model: every token this stage has not seen; its last row's logits
        # give the first draft token.
        self.calls += 1
        t_catchup = time.perf_counter()
        first, catchup = m.catch_up(live, full_vocab=True)
        t_catchup = time.perf_counter() - t_catchup
        rows = {r.request_id: first[i:i + 1] for i, r in enumerate(live)}  # per request: logits rows [j, vocab]
        props: dict[str, list[int]] = {r.request_id: [] for r in live}
        cum = {r.request_id: 1.0 for r in live}
        active, passes = live, 1
        while True:
            # 1. each active request walks its rows: row j picks this stage's token after proposal j - 1
            # was kept, and compares it with proposal j
            still, all_kept = [], True
            for r in active:
                rid, d = r.request_id, drafts[r.request_id]
                before, kept, done = len(d.tokens), 0, False
                for j, proposal in enumerate(props[rid] + [None]):
                    tok, q, c = self._pick(r, rows[rid][j], proposal)
                    d.tokens.append(tok)
                    d.confidence.append(c)
                    if q is not None:
                        d.probs = q[None] if d.probs is None else torch.cat([d.probs, q[None]])
                    cum[rid] *= c
                    done = len(d.tokens) >= max_len or (min_confidence is not None and cum[rid] < min_confidence)
                    kept += tok == proposal
                    if tok != proposal or done:
                        break
                if props[rid]:
                    self.kept += kept
                    self.misses += proposal is not None and tok != proposal
                    all_kept &= kept == len(props[rid])
                    self.helper.observe(self._view(r, d.tokens[:before]), 1, None, kept)
                if not done:
                    still.append(r)
            if any(props.values()):
                self.k2 = min(self.k2 + 1, K2_MAX) if all_kept else max(1, self.k2 - 1)
            if not still:
                break
            # 2. the lower stage proposes after each sequence and its draft so far
            t0 = time.perf_counter()
            views = [self._view(r, drafts[r.request_id].tokens) for r in still]
            proposal = self.helper.propose(views, self.k2)
            single = len(still) == 1
            if single:
                self.helper_seconds += time.perf_counter() - t0
                self.proposed_b1 += len(proposal.drafts[0].tokens)
            props = {r.request_id: d.tokens[:max(0, max_len - len(drafts[r.request_id].tokens) - 1)]
                     for r, d in zip(still, proposal.drafts)}
            # 3. one pass of this stage over [its last draft token] + the proposals, every row's logits
            t0 = time.perf_counter()
            spans = [[drafts[r.request_id].tokens[-1]] + props[r.request_id] for r in still]
            starts = [r.num_tokens + len(drafts[r.request_id].tokens) - 1 for r in still]
            logits = m.score(still, spans, starts, every_row=True, full_vocab=True)  # [sum of span lengths, vocab]
            if single:
                self.pass_seconds += time.perf_counter() - t0
                self.passes_b1 += 1
            self.passes += 1
            self.proposed += sum(len(p) for p in props.values())
            passes += 1
            at = 0
            for r, span in zip(still, spans):
                rows[r.request_id] = logits[at:at + len(span)]
                at += len(span)
            active = still
        for r in live:
            # rows of every draft token but the last were computed on it (the target's observe keeps those accepted)
            m.mark_drafted(r, len(drafts[r.request_id].tokens) - 1)
        return Proposal([drafts[r.request_id] for r in requests], passes, len(live), catchup, t_catchup)

    def _pick(self, r: Request, logits: torch.Tensor, proposal: Optional[int]):
        """This stage's token from its logits row [vocab] given the lower stage's proposal (None: none):
        -> (token, q row or None, its probability)."""
        if r.params.greedy:
            probs = torch.softmax(logits.float(), dim=-1)
            p, tok = probs.max(-1)
            return int(tok), None, float(p)
        q = warp_logits(logits[None].float(), r.params)[0]
        g = self.model.generator(r)
        if proposal is not None:
            u = torch.rand((1,), generator=g, dtype=torch.float64, device=q.device)
            if float(u) < float(q[proposal]):
                return proposal, q, float(q[proposal])
            tok = draw(without(q, proposal), g)
        else:
            tok = draw(q, g)
        return tok, q, float(q[tok])

    @staticmethod
    def _view(r: Request, draft: list[int]) -> Request:
        """The sequence as a lower stage sees it: the request's tokens and this stage's draft so far, greedy."""
        return Request(r.request_id, r.all_token_ids + draft, _GREEDY)

    def observe(self, request: Request, start: int, hidden, num_accepted: int) -> None:
        self.model.observe(request, start, hidden, num_accepted)
        # lower stages: their rows past the accepted drafts were computed on drafts that were rejected
        # (observe comes before the step's tokens are appended: request.num_tokens is the context's length)
        self.helper.truncate(request, request.num_tokens + num_accepted)

    def prefill(self, chunks: list[tuple[Request, int]]) -> int:
        """Every model level computes the prompt chunks (a free stage keeps no state of them)."""
        return self.model.prefill(chunks) + self.helper.prefill(chunks)

    def catchup_rows(self, request: Request) -> int:
        return self.model.catchup_rows(request) + self.helper.catchup_rows(request)

    def truncate(self, request: Request, valid: int) -> None:
        """As a lower stage: every level keeps only the rows of request's first `valid` positions."""
        self.model.truncate(request, valid)
        self.helper.truncate(request, valid)

    def release(self, request: Request) -> None:
        self.model.release(request)
        self.helper.release(request)

    def fork(self, parent: Request, child: Request) -> None:
        self.model.fork(parent, child)
