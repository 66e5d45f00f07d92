"""Per sequence and step, the draft expected to give the most tokens: the free drafters' (prompt
lookup, suffix drafting) or the draft model's.

A free draft's expected accepted tokens are the sum of its tokens' cumulative confidences (each
drafter measures its own: lookup by n-gram length, suffix by how often continuations went that way);
the draft model's, before it runs, sum_j a^j over the draft length, where a is the per-token acceptance
its drafts have been measured at (a prior of 0.6, then what was verified, decayed). The model runs only
for the sequences whose best free draft promises less, so steps where every sequence repeats itself
need no model pass at all. Whether drafting pays at all, and chains or trees, stays the cost model's
call (speculative/decoder.py), from what the steps yield per second.

Which sequences the model drafts for is the drafter's selection rule (`RULES`): "expected" (the above,
the "auto" method) or "free-first" (the model only where no free draft was found: "lookup+draft" and
"suffix+draft"). Where a sequence repeats itself (code re-using its own names and lines, quoted
context) prompt lookup drafts for free and is accepted more often than the small draft model (on
HumanEval with the embedded model: alpha ~0.78 vs ~0.6, measured by `specserve bench spec`). Lookup
here wants a match of at least 2 tokens: a one-token match is weak evidence, and the draft model does
better there (batch 1: 2.47 vs 2.29 tokens per target step). The model drafter still observes every
step, so its state stays in line with the target's and it picks up where the free drafts left off
(with a catch-up pass over what it missed).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Optional

from ..types import Draft, Request
from .base import Drafter, DrafterContext, Proposal

PRIOR_ALPHA, PRIOR_WEIGHT, DECAY = 0.6, 10.0, 0.995


def build(spec, ctx: DrafterContext) -> Drafter:
    """"auto": lookup and suffix drafting, the draft model where it promises more; without a draft model
    (none given and none ships for the target), lookup and suffix drafting alone."""
    from . import draft_model
    from .prompt_lookup import PromptLookupDrafter
    from .suffix import SuffixDrafter
    free = [PromptLookupDrafter(spec.lookup_max_ngram, min_ngram=2), SuffixDrafter(max_nodes=spec.tree_max_nodes)]
    has_model = spec.draft_model is not None or draft_model.ships_for(ctx.target_path)
    return AutoDrafter(free, draft_model.build(spec, ctx) if has_model else None)


def build_lookup_first(spec, ctx: DrafterContext) -> Drafter:
    """"lookup+draft": prompt lookup where the text repeats, the draft model elsewhere."""
    from . import draft_model
    from .prompt_lookup import PromptLookupDrafter
    return AutoDrafter([PromptLookupDrafter(spec.lookup_max_ngram, min_ngram=2)], draft_model.build(spec, ctx),
                       rule="free-first")


def build_suffix_first(spec, ctx: DrafterContext) -> Drafter:
    """"suffix+draft": suffix drafting where this or an earlier request's text matches (token trees where
    the continuations branch), the draft model elsewhere."""
    from . import draft_model
    from .suffix import SuffixDrafter
    return AutoDrafter([SuffixDrafter(max_nodes=spec.tree_max_nodes)], draft_model.build(spec, ctx), rule="free-first")


def expected_tokens(d: Draft) -> float:
    """Accepted tokens a draft is expected to give: its tokens' cumulative confidences, summed (a
    tree's nodes too: each is accepted with its path's chance)."""
    return sum(d.cumulative())


def most_expected(free: list[Draft], model_expects: float) -> list[int]:
    """The sequences whose best free draft promises fewer accepted tokens than the model's draft:
    expected_tokens(free[i]) < model_expects (sum_j a^j over the draft length)."""
    return [i for i, d in enumerate(free) if expected_tokens(d) < model_expects]


def free_first(free: list[Draft], model_expects: float) -> list[int]:
    """The sequences without a free draft: len(free[i].tokens) == 0."""
    return [i for i, d in enumerate(free) if not d.tokens]


def pays_catchup(rows: int, price: Optional[float], gain: float) -> bool:
    """Whether a model draft expected to give `gain` more accepted tokens than the sequence's best free
    draft pays for the `rows` of catch-up it must run first (the tokens its KV has not seen: a whole
    prompt where it did not follow the prompt's chunks): rows * price <= gain, price being the tokens
    a catch-up row costs the batch (its seconds at the batch's plain tokens per second; None: not
    known, it pays). Within one draft, not amortized over drafts to come: past batch 1 the model drafts
    a sequence only now and then (its free drafts win most steps, drafting stops and starts), so the
    drafts a catch-up would pay for mostly never come (docs/decisions.md#catchup-price)."""
    return price is None or rows * price <= gain


# selection rules: (each sequence's best free draft, what a model draft is expected to give) -> the
# sequences the model drafts for
RULES: dict[str, Callable[[list[Draft], float], list[int]]] = {"expected": most_expected, "free-first": free_first}


class AutoDrafter(Drafter):
    def __init__(self, free: list[Drafter], model: Optional[Drafter], rule: str = "expected"):
        self.free, self.model = free, model  # model None: the free drafters alone
        self.rule = RULES[rule]
        self.wants_hidden_states = model is not None and model.wants_hidden_states
        self.makes_trees = model is not None and model.makes_trees
        self.counts = [PRIOR_WEIGHT * PRIOR_ALPHA, PRIOR_WEIGHT]  # model drafts: [accepted, accepted + rejections]
        self.chosen = {"model": 0, "free": 0}  # drafts handed out by kind (for spec_stats)
        self.catchup_price: Optional[float] = None  # tokens a row of the model's catch-up costs the batch

    @property
    def model_alpha(self) -> float:
        return self.counts[0] / self.counts[1]

    def _best_free(self, requests: list[Request], max_len: int, min_confidence: Optional[float]) -> list[Draft]:
        best = [Draft() for _ in requests]
        for drafter in self.free:
            for i, d in enumerate(drafter.propose(requests, max_len, min_confidence).drafts):
                if d.tokens and expected_tokens(d) > expected_tokens(best[i]):
                    best[i] = d
        return best

    def propose(self, requests: list[Request], max_len: int, min_confidence: Optional[float] = None,
                tree=None) -> Proposal:
        drafts = self._best_free(requests, max_len, min_confidence)
        a = self.model_alpha
        model_expects = sum(a ** j for j in range(1, max_len + 1))
        need = [] if self.model is None else [
            i for i in self.rule(drafts, model_expects)
            if pays_catchup(self.model.catchup_rows(requests[i]), self.catchup_price,
                            model_expects - expected_tokens(drafts[i]))]
        self.chosen["free"] += sum(1 for i, d in enumerate(drafts) if d.tokens and i not in need)
        if not need:
            return Proposal(drafts)
        proposal = self.model.propose([requests[i] for i in need], max_len, min_confidence, tree)
        for i, d in zip(need, proposal.drafts):
            if d.tokens or not drafts[i].tokens:
                drafts[i] = d
                self.chosen["model"] += bool(d.tokens)
        return replace(proposal, drafts=drafts)  # what it cost is the model's part

    def propose_free(self, requests: list[Request], max_len: int) -> Optional[Proposal]:
        return Proposal(self._best_free(requests, max_len, None))

    def on_verified(self, request: Request, draft: Draft, accepted: int) -> None:
        """The model's drafts update the model's measured acceptance; each draft goes on to its maker."""
        if self.model is not None and draft.origin == self.model.origin:
            tried = len(draft.tokens)
            self.counts = [DECAY * self.counts[0] + accepted, DECAY * self.counts[1] + accepted + (accepted < tried)]
            self.model.on_verified(request, draft, accepted)
            return
        for drafter in self.free:
            if drafter.origin == draft.origin:
                drafter.on_verified(request, draft, accepted)

    def observe(self, request: Request, start: int, hidden, num_accepted: int) -> None:
        for drafter in self.free:
            drafter.observe(request, start, hidden, num_accepted)
        if self.model is not None:
            self.model.observe(request, start, hidden, num_accepted)

    def prefill(self, chunks: list[tuple[Request, int]]) -> int:
        return 0 if self.model is None else self.model.prefill(chunks)

    def catchup_rows(self, request: Request) -> int:
        return 0 if self.model is None else self.model.catchup_rows(request)

    def set_catchup_price(self, tokens_per_row: Optional[float]) -> None:
        self.catchup_price = tokens_per_row

    def release(self, request: Request) -> None:
        for drafter in self.free:
            drafter.release(request)
        if self.model is not None:
            self.model.release(request)

    def fork(self, parent: Request, child: Request) -> None:
        if self.model is not None:
            self.model.fork(parent, child)

    def report(self) -> dict:
        if self.model is None:
            return {"chosen": dict(self.chosen)}
        return {**self.model.report(), "chosen": dict(self.chosen), "model_alpha": self.model_alpha}

    def reset_report(self) -> None:
        self.chosen = {"model": 0, "free": 0}
        if self.model is not None:
            self.model.reset_report()
