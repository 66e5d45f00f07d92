"""Which draft tokens a step verifies: a budget for the whole batch along the measured step-time curve."""
from __future__ import annotations

from typing import Optional

from ..types import Draft

# A row must beat the plain tokens its time would give by this factor. The bare-pass curve leaves out
# what a verify step adds per sequence (verification, roll-back, span attention), and the free drafts'
# calibrated confidences ran ahead of what got accepted (docs/decisions.md#cost-model).
SELECT_MARGIN = 1.1


def select_drafts(drafts: list[Draft], curve: list[float], margin: float = SELECT_MARGIN,
                  batch: Optional[int] = None, plain_seconds: Optional[float] = None) -> list[Draft]:
    """Which draft tokens to verify. A token is accepted with about its cumulative confidence (the
    drafters' confidences are calibrated), and curve[n] is the measured time of a step with n draft
    rows on top of one row per sequence. A token is worth its row when its chance of acceptance beats
    the tokens that row's time would give plain decoding (curve[0] / batch seconds per token), by
    `margin`: taking tokens by falling cumulative confidence (a sequence's tokens in order), keep the count with the
    most expected tokens beyond that cost. Time already spent drafting is sunk and changes nothing here.
    On a CPU the curve is not a line (kernel builds change with the rows: AVX up to 8, AMX past that,
    dense products past the block kernel's limit in models.layers), so this is a budget for the whole
    batch rather than a per-token threshold. A token tree is cut the same way: its nodes by falling
    cumulative confidence, which keeps every kept node's parent (a child never scores above its
    parent, and parents come first on ties). It looks at draft-side information only, so
    verification stays exact. batch: the step's sequences, where only some of them draft; default:
    one per draft. plain_seconds: a plain decoding step of the batch, what a row's time is worth in
    tokens (default curve[0]; a step that also carries a prompt chunk starts its curve higher, and
    pricing rows by its slower token rate made them look cheap: 10 draft rows rode beside 16 prompt
    tokens at a confidence of 0.4)."""
    batch = batch or len(drafts)  # the step's sequences: curve[0] is their plain step
    candidates = []  # (cumulative confidence, position in its draft, sequence)
    for i, d in enumerate(drafts):
        for j, cum in enumerate(d.cumulative()):
            candidates.append((cum, j, i))
    candidates.sort(key=lambda t: (-t[0], t[1]))
    plain_rate = batch / (plain_seconds or curve[0])  # tokens per second of plain decoding
    best_n, best_surplus, expected = 0, 0.0, 0.0
    for n, t in enumerate(curve[1:len(candidates) + 1], start=1):
        expected += candidates[n - 1][0]
        surplus = expected - margin * plain_rate * (t - curve[0])
        if surplus > best_surplus:
            best_n, best_surplus = n, surplus
    keep: list[list[int]] = [[] for _ in drafts]
    for _, j, i in candidates[:best_n]:
        keep[i].append(j)
    return [d.subset(k) for d, k in zip(drafts, keep)]

