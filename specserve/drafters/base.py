"""The drafter interface: every drafting method is a class with these few methods, in its own file.

The engine, each step:
  1. `propose(requests, max_len, min_confidence)` for the requests that decode this step -> a Draft
     per request: up to max_len token ids and, for sampled requests, the draft distribution q that
     drew them ([n, vocab], warped with the request's own params); None for deterministic drafts.
  2. runs the target over every request's [last token] + drafts span and verifies;
  3. `observe(request, start, hidden, num_accepted)` for every request the target computed rows for
     (prefill chunks and plain decode steps too): the target's last hidden states of the rows that
     stayed valid ([rows, hidden], first row at position `start`; only for drafters that want them),
     and how many drafts were accepted. The drafter rolls its own state back to match.
  4. `release(request)` when a request finishes or is preempted; `fork(parent, child)` when an n > 1
     sample starts from its leader's prompt.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from ..types import Request


@dataclass
class Draft:
    tokens: list[int] = field(default_factory=list)
    probs: Optional[torch.Tensor] = None  # [len(tokens), vocab] q that drew them; None: deterministic/greedy
    # estimated chance each token is accepted given the ones before it were: its draft probability for
    # a model (well calibrated for the EAGLE draft), a measured rate for prompt lookup
    confidence: list[float] = field(default_factory=list)


class Drafter:
    wants_hidden_states = False  # True: observe() gets the target's last hidden states
    last_catchup_rows = 0  # rows the last propose() fed before drafting (the prompt, the first time)
    # Draft-model passes the last propose() ran (its longest model draft: one pass per drafted position)
    # and over how many requests; 0 when no model ran (lookups only), so that free lookups are not
    # timed as if they were draft-model steps.
    last_model_passes = 0
    last_model_batch = 0

    def propose(self, requests: list[Request], max_len: int, min_confidence: Optional[float] = None) -> list[Draft]:
        """Up to max_len draft tokens per request. With min_confidence, stop a request's draft once the
        product of its draft probabilities falls below it (threshold decoding)."""
        raise NotImplementedError

    def propose_free(self, requests: list[Request], max_len: int) -> Optional[list[Draft]]:
        """Drafts that cost next to nothing to make (a lookup in the sequence's own tokens), which the
        engine still verifies, where they pay, on steps where it judged full drafting not to pay.
        None: this drafter has none."""
        return None

    def observe(self, request: Request, start: int, hidden: Optional[torch.Tensor], num_accepted: int) -> None:
        pass

    def release(self, request: Request) -> None:
        pass

    def fork(self, parent: Request, child: Request) -> None:
        pass

