"""Guided generation inside the step loop (the engine's side; grammars in specserve/guided):

  1. adding a request compiles its constraint (cached) and gives each of its samples a Guide; a
     malformed or unsatisfiable constraint is a one-line ValueError then, never a hang later;
  2. after drafting, each constrained sequence's draft is cut where the grammar refuses a token
     (`prune_drafts`, the step's DraftBatch -> another): a chain at its first refused token, a tree's
     refused nodes with their subtrees;
  3. after the target pass, every logits row of a constrained sequence is masked to what its grammar
     allows at that row (`mask_rows`): one row on a plain step, and along the draft in a verify span,
     so the verifier (greedy, or rejection sampling against the draft's q) works on the constrained
     distribution, and the output is distributed as constrained sampling without speculation;
  4. each emitted token advances the Guide (`LLMEngine._append`), and afterwards the tokens the grammar
     forces (`forced`: the rest of a key, a closing brace, the one remaining choice) are appended
     without sampling (their constrained probability is 1) and computed in the next pass as a prefill
     chunk: fast-forward;
  5. a dead end (the grammar refuses a token its own mask allowed or its fast-forward forced: what it
     requires has no spelling in the vocabulary, e.g. a byte with no token) finishes that request
     alone with finish_reason "error" (the server: a 400); one known from the grammar's start is a
     one-line ValueError when the request is added.

Why a refused token of a sampled draft with its own q stays in the span (as a sure rejection): the
verifier's draw after a rejection comes from the residual max(p - q, 0), not from p. Cutting the draft
before the refused token would draw from p at that position and bias the output towards what q
rarely proposes. Kept, the token is rejected (p = 0 there after masking) and the draw is from the
residual, as it must be. Deterministic drafts (q = one-hot) and greedy requests just drop it (the
residual of a one-hot q at a token p gives 0 to is p itself)."""
from __future__ import annotations

from typing import Mapping, Optional

import torch

from ..guided import GrammarCompiler, Guide
from ..sampling.guided import allow_all, apply_bitmask
from ..types import Draft, DraftBatch, SamplingParams


def prune_drafts(drafts: DraftBatch, constrained: Mapping[str, tuple[Guide, SamplingParams]]) -> DraftBatch:
    """The step's drafts with each constrained request's (constrained: request id -> its guide and
    params) cut to what its grammar allows; a draft cut to nothing is left out. Reads the guides only
    (each walk is rolled back)."""
    out: DraftBatch = {}
    for rid, d in drafts.items():
        got = constrained.get(rid)
        kept = d if got is None else _prune(d, *got)
        if kept is not None:
            out[rid] = kept
    return out


def _prune(d: Draft, g: Guide, params: SamplingParams) -> Optional[Draft]:
    if not d.tokens:
        return d
    if not d.is_tree:
        n = g.valid_prefix(d.tokens)
        if n == len(d.tokens):
            return d
        # a sampled draft with its own q keeps its refused token as a sure rejection (module doc)
        keep = list(range(n + 1 if d.probs is not None and not params.greedy else n))
    else:
        # a node is kept when its whole path is allowed (a refused node's subtree goes with it)
        keep = [j for j, path in enumerate(d.paths()) if g.valid_prefix(path) == len(path)]
        if len(keep) == len(d.tokens):
            return d
    return d.subset(keep) if keep else None


class GuidedDecoding:
    def __init__(self, tokenizer, fast_forward: bool = True):
        self.tokenizer, self.fast_forward = tokenizer, fast_forward
        self._compiler: Optional[GrammarCompiler] = None  # built on the first guided request

    @property
    def compiler(self) -> GrammarCompiler:
        if self._compiler is None:
            try:
                import llguidance  # noqa: F401
            except ImportError:
                raise ValueError("guided generation needs llguidance: pip install llguidance") from None
            self._compiler = GrammarCompiler(self.tokenizer)
        return self._compiler

    def guide(self, params: SamplingParams) -> Optional[Guide]:
        """A fresh Guide for one sample of a request (None: unconstrained); ValueError if the constraint
        cannot be compiled."""
        g = params.guided()
        return None if g is None else self.compiler.guide(*g)

    # --- logits --------------------------------------------------------------------------------
    @staticmethod
    def mask_rows(logits: torch.Tensor, spans: list[tuple[int, Guide, Optional[object]]]) -> None:
        """In place, logits [R, V]. spans: (first row, guide, the draft verified there or None): row
        first + 0 gets the guide's current mask, and draft token j's row (first + j + 1) the mask after
        the tokens from the root down to j, where the grammar allows them (else it stays open: the
        verifier never reads past a sure rejection)."""
        rows, fills = [], []  # per row: its guide and the path to walk first (a refused path: the row stays open)
        for first, g, d in spans:
            rows.append(first)
            fills.append((g, ()))
            for j, path in enumerate(() if d is None else d.paths()):
                rows.append(first + j + 1)
                fills.append((g, path))
        if not rows:
            return
        bitmask = allow_all(len(rows), spans[0][1].vocab_size)
        for i, (g, path) in enumerate(fills):
            n = g.advance(path)
            if n == len(path):
                g.fill_mask(bitmask, i)
            g.rollback(n)
        apply_bitmask(logits, rows, bitmask)

