"""The drafter interface: every drafting method is a class with these few methods, in its own file,
plus one line in `specserve.registry.DRAFTERS` naming its factory `build(spec, ctx) -> Drafter`.

The engine, each step:
  1. `propose(requests, max_len, min_confidence, tree)` for the requests that decode this step -> a
     Proposal: a Draft per request (up to max_len token ids and, for sampled requests, the draft
     distribution q that drew them ([n, vocab], warped with the request's own params); None for
     deterministic drafts), plus what drafting cost (model passes, their batch, catch-up rows) for the
     cost model. With a TreeShape (drafters whose `makes_trees`), a token tree of depth <= max_len:
     the draft's top_k children at the beam best nodes of each level (Draft.parents);
  2. runs the target over every request's [last token] + drafts span and verifies (drafts the engine's
     selection, guided pruning or the scheduler dropped are not verified);
  3. `on_verified(request, draft, accepted)` for each verified draft: the draft as verified (after the
     selection and pruning; `draft.origin` says whose it was, and a drafter made of others passes it
     to the one that made it) and how many of its tokens were accepted: what drafters learn their
     acceptance from, without guessing whether their proposal made it to the target;
  4. `observe(request, start, hidden, num_accepted)` for every request the target computed rows for
     (prefill chunks and plain decode steps too): the target's last hidden states of the rows that
     stayed valid ([rows, hidden], first row at position `start`; only for drafters that want them),
     and how many drafts were accepted. The drafter rolls its own state back to match. A request
     admitted from a prefix-cache hit starts at `start` > 0: a drafter that needs the skipped
     positions' hidden states reads them with `DrafterContext.prefix_features`.
     Drafters that `wants_span_argmax` (lookahead decoding) first get `observe_span`: the target's
     greedy token after every row of the verified span, rejected rows too, and the accepted path.
  5. `release(request)` when a request finishes or is preempted; `fork(parent, child)` when an n > 1
     sample starts from its leader's prompt.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from ..types import Draft, Request, TokenOrigin


@dataclass(frozen=True)
class TreeShape:
    """How wide a token tree grows (EAGLE-2): each level expands its `beam` nodes of highest cumulative
    confidence into their `top_k` most likely children; at most `max_nodes` nodes are kept (by
    cumulative confidence) before the engine's selection cuts the batch's drafts to what pays."""

    top_k: int = 4
    beam: int = 4
    max_nodes: int = 15  # with the root, a verify span of 16 rows: the C++ paged kernel's longest


@dataclass
class Proposal:
    """What one `propose` call made and what it cost."""

    drafts: list[Draft] = field(default_factory=list)  # one per request, in the order asked
    # Draft-model passes run (one per drafted position of the longest model draft) and over how many
    # requests; 0 when no model ran (lookups only), so that free lookups are not timed as model steps.
    model_passes: int = 0
    model_batch: int = 0
    catchup_rows: int = 0  # rows fed before drafting (every token the drafter had not seen yet)
    catchup_seconds: float = 0.0  # what feeding them took (with the first draft position's logits)

    @property
    def longest(self) -> int:
        return max((len(d.tokens) for d in self.drafts), default=0)


@dataclass
class DrafterContext:
    """What a drafter factory may use: the serving target (as models.TargetView) and its files."""

    target: object  # models.TargetView
    tokenizer: object
    target_path: str
    num_blocks: int  # the target's KV blocks: a drafter's own cache gets as many
    block_size: int
    attention: str  # the resolved PAD/SPLIT mode
    # (block table, n) -> the target's last hidden states at positions 0 .. n - 1 [n, hidden], kept
    # beside the KV for prefix-cache hits (KVCache.read_features); None where they are not kept
    prefix_features: Optional[Callable[[list[int], int], Optional[torch.Tensor]]] = None
    # the KV cache type asked for (--kv-cache-dtype): a drafter's own cache takes it too; None (auto):
    # the drafter's own choice (a draft model's dtype, EAGLE's float32)
    kv_dtype: Optional[torch.dtype] = None


class Drafter:
    wants_hidden_states = False  # True: observe() gets the target's last hidden states
    makes_trees = False  # True: propose() takes a TreeShape
    wants_span_argmax = False  # True: observe_span() after each verification
    origin = TokenOrigin.DRAFT  # what its drafts count as (Draft.origin)

    def propose(self, requests: list[Request], max_len: int, min_confidence: Optional[float] = None,
                tree: Optional[TreeShape] = None) -> Proposal:
        """Up to max_len draft tokens per request (a tree of depth <= max_len with a TreeShape). With
        min_confidence, stop a request's draft (a tree: a node's expansion) once the product of its
        draft probabilities falls below it (threshold decoding)."""
        raise NotImplementedError

    def propose_free(self, requests: list[Request], max_len: int) -> Optional[Proposal]:
        """Drafts that cost next to nothing to make (a lookup in the sequence's own tokens), which the
        engine still verifies, where they pay, on steps where it judged full drafting not to pay.
        None: this drafter has none."""
        return None

    def on_verified(self, request: Request, draft: Draft, accepted: int) -> None:
        """request's draft was verified this step: `draft` as verified (after the engine's selection and
        guided pruning; its origin says whose it was), `accepted` of its tokens accepted (a tree: the
        accepted path's length). Called once per verified draft, before `observe`."""

    def observe(self, request: Request, start: int, hidden: Optional[torch.Tensor], num_accepted: int) -> None:
        pass

    def prefill(self, chunks: list[tuple[Request, int]]) -> int:
        """The target computed these requests' prompts up to (request, end) this step. A drafter that
        keeps state of its own over the context (a draft model's KV) may compute the same positions now,
        in the same step, as vLLM runs a draft model's prefill with the target's: left to the first
        drafting step, the draft's whole prompt landed in the decode phase (a 0.5B draft's 111-token
        prompt took 0.18 s there: docs/decisions.md#draft-prefill). Called after every `observe` of the
        step. Returns the rows it computed."""
        return 0

    def catchup_rows(self, request: Request) -> int:
        """Rows this drafter would feed for request before drafting for it: the tokens its own state
        (a draft model's KV) has not seen. 0 for drafters without such state."""
        return 0

    def set_catchup_price(self, tokens_per_row: Optional[float]) -> None:
        """What a row of catch-up costs the step's batch, in tokens (the cost model's
        `catchup_price`), told before `propose`; a drafter that chooses among others weighs a model's
        catch-up against what its draft is expected to give (drafters/auto.py). None: not known."""

    def observe_span(self, request: Request, draft: Draft, argmax: list[int], path: list[int]) -> None:
        """request's verified draft (as verified: after the engine's selection), the target's greedy
        token after each of its span's rows (argmax[0]: after the last known token; argmax[j + 1]:
        after draft token j and its ancestors) and the accepted draft indices, root first."""

    def release(self, request: Request) -> None:
        pass

    def truncate(self, request: Request, valid: int) -> None:
        """As a lower stage of staged drafting (drafters/staged.py): forget what was drafted for request
        past its first `valid` positions. Drafters whose state does not outlive a round (free drafters
        drafting for a stage's draft) just release it."""
        self.release(request)

    def fork(self, parent: Request, child: Request) -> None:
        pass

    def report(self) -> dict:
        """What this drafter measured of itself, for LLM.spec_stats() (staged drafting: per stage pair)."""
        return {}

    def reset_report(self) -> None:
        """Start report()'s counts afresh (LLM.reset_spec_stats)."""


__all__ = ["Draft", "Drafter", "DrafterContext", "Proposal", "TreeShape"]
