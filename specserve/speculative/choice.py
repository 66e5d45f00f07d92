"""The per-sequence choice: which of a step's decoding sequences draft, and when one left plain is
measured again.

A drafting step for every sequence of a batch first catches the draft up on all of their tokens (over
half of a batch-16 step on the 2-core CPU), so drafting only where a sequence's own recent acceptance
says it pays is what keeps a batch of unpredictable sequences near regular decoding's speed
(docs/decisions.md#per-sequence-choice). The sequences left plain are
probed (drafted for once) after 4, then 8, 16 ... plain steps of their own.

Seeded sampled requests are chosen as the others are: their output does not depend on what was
drafted (sampling/seeded.py).

Lifecycle, per request id: `worth_drafting` each step it decodes, `record` after each of
its verify steps, `release` when it finishes.
"""
from __future__ import annotations

import math
from typing import Optional

from ..types import Request
from .cost_model import CostModel

# A shared sequence's own acceptance forgets at this rate per verify step: text turns predictable and
# back within a reply (a list, then prose), and the choice should follow within a few steps.
RECENT_DECAY = 0.8
# What a plain sequence's probes may cost, as a share of its plain decoding (`probe_wait`), and the
# longest wait between them.
PROBE_BUDGET, MAX_PROBE_WAIT = 0.02, 256
# Above this break-even confidence plain sequences are not probed: the draft's first tokens are
# accepted less often than that even on code, so a probe there (which first catches the draft up on
# every token the sequence decoded plainly) cannot find a draft that pays
# (docs/decisions.md#per-sequence-choice).
PROBE_MAX_GATE = 0.9


class SequenceChoice:
    """Per request: its recent acceptance (decayed [accepted, accepted + rejections] of its verify
    steps) and, while it decodes plainly, (plain steps in a row, steps before its next probe)."""

    def __init__(self, costs: CostModel, prior_alpha: float, retry_every: int, retry_max: int):
        self.costs, self.prior_alpha = costs, prior_alpha
        self.retry_every, self.retry_max = retry_every, retry_max
        self.recent: dict[str, tuple[float, float]] = {}
        self.plain: dict[str, tuple[int, int]] = {}

    # --- shared requests --------------------------------------------------------------------------
    def worth_drafting(self, shared: list[Request], gate: float, probe: bool = False) -> list[Request]:
        """The sequences whose recent acceptance (decayed, with the batch's alpha as a prior worth 2
        tokens) beats `gate`, the confidence a draft token must have to pay for its row and draft
        step; the others decode plainly, each probed again after its wait (4, doubling up to
        `probe_wait` while probes do not lift it). probe: the batch's own probe after plain steps,
        which drafts for one sequence at least (the likeliest): without it, a sequence left out after
        one rejected draft waited for its own probe to come round on the batch's probes, and a code
        prompt at batch 1 drafted once in 96 tokens. No probes where the gate is above
        PROBE_MAX_GATE (batch 8 and more on the 2-core CPU)."""
        prior = self.costs.alpha if self.costs.alpha is not None else self.prior_alpha
        alphas = {}
        for r in shared:
            num, den = self.recent.get(r.request_id, (0.0, 0.0))
            alphas[r.request_id] = (num + 2 * prior) / (den + 2)
        longest = None  # the wait cap, computed once and only if some sequence is below the gate
        keep = []
        for r in shared:
            if alphas[r.request_id] >= gate:
                self.plain.pop(r.request_id, None)
                keep.append(r)
            elif gate < PROBE_MAX_GATE:
                longest = longest or self.probe_wait(len(shared))
                if self.probe_due(r.request_id, longest):
                    keep.append(r)
        if not keep and probe and gate < PROBE_MAX_GATE:
            keep = [max(shared, key=lambda r: alphas[r.request_id])]
        return keep

    def record(self, request_id: str, accepted: int, depth: int) -> None:
        """A shared request's verify step: `accepted` of a draft `depth` deep."""
        if depth:
            num, den = self.recent.get(request_id, (0.0, 0.0))
            d = RECENT_DECAY
            self.recent[request_id] = (d * num + accepted, d * den + accepted + (accepted < depth))

    def probe_wait(self, batch: int) -> int:
        """The longest wait between a plain sequence's probes: long enough that a probe that finds
        nothing (a draft pass and a verify row for one sequence) costs at most PROBE_BUDGET of that
        sequence's plain decoding, and never below retry_max: one sequence's share of a large batch's
        step is small, so its probes come rarer there (docs/decisions.md#per-sequence-choice)."""
        t_plain, t_more = self.costs.step_seconds(batch, batch), self.costs.step_seconds(batch + 1, batch)
        t_draft = self.costs.draft_step_seconds(1)
        if t_plain is None or t_more is None or t_draft is None:
            return self.retry_max
        probe = t_draft + max(0.0, t_more - t_plain)
        return min(MAX_PROBE_WAIT, max(self.retry_max, math.ceil(probe / (PROBE_BUDGET * t_plain / batch))))

    def probe_due(self, request_id: str, longest: Optional[int] = None) -> bool:
        """Count one more plain step for a request kept plain; True when one drafting step should
        measure it again (the wait then doubles, up to `longest` (retry_max), until drafting pays)."""
        since, retry = self.plain.get(request_id, (0, self.retry_every))
        if since + 1 >= retry:
            self.plain[request_id] = (0, min(2 * retry, longest or self.retry_max))
            return True
        self.plain[request_id] = (since + 1, retry)
        return False

    def release(self, request_id: str) -> None:
        self.recent.pop(request_id, None)
        self.plain.pop(request_id, None)

