"""The cost model speculation decides with: seconds per step by target rows (calibrated at start-up by
speculative/calibration.py, then measured while serving), seconds per draft step, acceptance, and what drafting
steps yielded against plain steps. Predicts tokens per second of a step with a given draft length.
A pure table of numbers: it records what it is told and never runs a model."""
from __future__ import annotations

import bisect
from typing import Optional

DRAFT_COST_GUESS = 0.1  # draft step / target step, before a draft step is measured
# Drafting must yield this much more than plain steps. Break-even drafting is not neutral: it speeds the
# sequences whose drafts are accepted and slows the rest with longer steps, so the sequences that finish
# first (most of the mean per-token latency) lose (docs/decisions.md#cost-model).
DRAFTING_MARGIN = 1.05
# A draft model's catch-up (or prefill) pass is timed per row from this many rows: in a shorter one the
# pass's fixed cost (its weights read once) would be priced as rows.
TIMED_CATCHUP_ROWS = 32
# the yields key of plain steps that verified free drafts (lookups), apart from drafting steps' shapes
FREE_SHAPE = "free"


class CostModel:
    """Seconds per step as a function of the number of target rows (the whole step after drafting:
    target pass, verification, bookkeeping; measured while serving, seeded by a calibration of bare
    target passes plus the measured difference), seconds per draft step by batch size, and acceptance.
    Predicts the tokens per second of a step with a given draft length."""

    def __init__(self, ema: float = 0.3, prior_alpha: Optional[float] = None):
        self.target: dict[int, float] = {}  # measured whole-step seconds by rows
        self.calibrated: dict[int, float] = {}  # bare target pass seconds by rows
        self.draft: dict[int, float] = {}
        self.scale: dict[int, float] = {}  # whole step over the bare pass, by sequences in the step
        self.ema = ema
        self.alpha_num, self.alpha_den = 0.0, 0.0  # decayed counts of accepted and (accepted + rejections)
        if prior_alpha is not None:  # a weak prior worth 2 pseudo-tokens
            self.alpha_num, self.alpha_den = 2 * prior_alpha, 2.0
        # What drafting steps actually yielded, by (batch size, draft shape): [tokens emitted per
        # sequence, seconds of drafting, seconds of the step after drafting], averaged over steps.
        self.yields: dict[tuple[int, str], list[float]] = {}
        self.plain: dict[int, float] = {}  # measured seconds of steps without drafts, by batch size
        self.plain_steps: dict[int, int] = {}  # how many, by batch size
        self.catchup: Optional[float] = None  # measured seconds per row a draft model catches up on

    def record_target(self, rows: int, seconds: float, batch: Optional[int] = None) -> None:
        if batch is not None and rows == batch:  # one row per sequence: a plain decoding step
            old = self.plain.get(batch)
            self.plain[batch] = seconds if old is None else (1 - self.ema) * old + self.ema * seconds
            self.plain_steps[batch] = self.plain_steps.get(batch, 0) + 1
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

    def reset_calibration(self) -> None:
        """Forget the calibration (before it is taken again) and what was measured against it."""
        self.calibrated.clear()
        self.scale.clear()

    def calibration_disturbed(self, min_steps: int = 8, ratio: float = 0.75) -> bool:
        """Whether plain one-sequence steps (at least min_steps, their moving average) run below `ratio`
        of the calibrated bare one-row pass. A whole step costs at least its bare pass, so the
        calibration was taken while the machine was busier than now."""
        t_cal, t_plain = self.calibrated.get(1), self.plain.get(1)
        return (t_cal is not None and t_plain is not None and self.plain_steps.get(1, 0) >= min_steps
                and t_plain < ratio * t_cal)

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
            # Without steps of this batch size: the bare pass plus what steps measured so far cost
            # beyond theirs; for no batch size in particular, measured steps by rows where there are.
            # A batch size without steps yet does not read those single steps (of any batch): they
            # were noisy enough to make a 17th row look cheaper than the 16th, and a fresh engine's
            # first batch of 16 then drafted for all its sequences.
            if batch is not None:
                measured = {}
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

    def record_catchup(self, rows: int, seconds: float) -> None:
        """A draft model's pass over `rows` rows it had not seen (a prompt, or tokens decoded while it
        did not draft) took `seconds` (passes under TIMED_CATCHUP_ROWS rows are not counted)."""
        if rows < TIMED_CATCHUP_ROWS:
            return
        new = seconds / rows
        self.catchup = new if self.catchup is None else (1 - self.ema) * self.catchup + self.ema * new

    def catchup_row_seconds(self) -> Optional[float]:
        """Seconds a draft model takes per row it catches up on: as measured; before that, its one-row
        draft step scaled as the target's calibrated pass over its most rows is to its one-row pass
        (a prompt-sized pass costs per row a fraction of a one-row pass on either model)."""
        if self.catchup is not None:
            return self.catchup
        t1 = self.step_seconds(1)
        if t1 is None:
            return None
        rows = max(self.calibrated) if self.calibrated else 1
        t_draft = self.draft_step_seconds(1) or DRAFT_COST_GUESS * t1
        return t_draft * self.step_seconds(rows) / (rows * t1)

    def catchup_price(self, batch: int) -> Optional[float]:
        """Tokens a row of draft catch-up costs a batch of `batch` sequences: its seconds at the tokens
        per second plain steps of the batch give (None: not measured yet)."""
        row, t_plain = self.catchup_row_seconds(), self.plain.get(batch) or self.step_seconds(batch, batch)
        return None if row is None or not t_plain else row * batch / t_plain

    def cap_draft(self, batch: int, seconds_per_step: float) -> None:
        """An upper bound of a steady draft step at this batch size: a probe's passes with the catch-up
        they began with. An estimate above it came from a stalled step; left there it priced every
        later drafting step too high and kept drafting off for good (probes are never steady steps),
        so it comes down to the bound."""
        old = self.draft.get(batch)
        if old is not None and seconds_per_step < old:
            self.draft[batch] = seconds_per_step

    def record_acceptance(self, accepted: int, rejections: int, decay: float = 0.9) -> None:
        self.alpha_num = decay * self.alpha_num + accepted
        self.alpha_den = decay * self.alpha_den + accepted + rejections

    @property
    def alpha(self) -> Optional[float]:
        return self.alpha_num / self.alpha_den if self.alpha_den > 0 else None

    def record_yield(self, batch: int, tokens: int, draft_seconds: float, step_seconds: float,
                     ema: float = 0.2, shape: str = "chain") -> None:
        """A drafting step over `batch` sequences, drafting `shape`s, emitted `tokens`; its drafting took
        draft_seconds and the rest of the step (target pass, verification, bookkeeping) step_seconds."""
        new = [tokens / batch, draft_seconds, step_seconds]
        old = self.yields.get((batch, shape))
        self.yields[batch, shape] = new if old is None else [(1 - ema) * o + ema * n for o, n in zip(old, new)]

    def drafting_rate(self, batch: int, shape: str = "chain") -> Optional[float]:
        """Tokens per second of drafting steps of this shape at this batch size, as measured (None: none yet)."""
        y = self.yields.get((batch, shape))
        if y is None:
            return None
        tokens, t_draft, t_step = y
        return batch * tokens / (t_step + t_draft)

    def best_shape(self, batch: int, shapes: tuple[str, ...]) -> tuple[str, bool]:
        """(the shape whose drafting steps yielded the most tokens per second at this batch size, whether
        every shape has been measured there); an unmeasured one first, so that it gets measured."""
        rates = {s: self.drafting_rate(batch, s) for s in shapes}
        unmeasured = [s for s in shapes if rates[s] is None]
        if unmeasured:
            return unmeasured[0], False
        return max(shapes, key=lambda s: rates[s]), True

    def drafting_pays(self, batch: int, margin: float = DRAFTING_MARGIN, shape: Optional[str] = None) -> Optional[bool]:
        """Whether drafting steps (of `shape`; None: the best measured shape) at this batch size emit more
        tokens per second than plain steps, by at least `margin`, from what drafting steps yielded so
        far (None: none measured yet). Unlike a prediction from the acceptance rate, this counts what
        the formula leaves out: drafts cut by the selection (verified rows per sequence well below k),
        draft passes whose tokens all got cut."""
        shapes = [shape] if shape is not None else [s for b, s in self.yields if b == batch and s != FREE_SHAPE]
        rates = [r for r in (self.drafting_rate(batch, s) for s in shapes) if r is not None]
        t_plain = self.plain.get(batch) or self.step_seconds(batch, batch)
        if not rates or t_plain is None:
            return None
        # Both sides as measured at this batch size: a verify step costs more than the cost curve says
        # for its rows (verification, attention over several query rows per sequence, bookkeeping): the
        # curve's estimate had drafting win where it lost (docs/decisions.md#cost-model).
        return max(rates) > margin * batch / t_plain

    def free_drafts_pay(self, batch: int) -> Optional[bool]:
        """Whether plain steps that verified free drafts emitted more tokens per second (their lookups'
        time included) than plain steps without drafts at this batch size (None: not measured yet)."""
        rate = self.drafting_rate(batch, FREE_SHAPE)
        t_plain = self.plain.get(batch) or self.step_seconds(batch, batch)
        if rate is None or t_plain is None:
            return None
        return rate >= batch / t_plain

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

    def tokens_per_second(self, batch: int, k: int, alpha: Optional[float] = None) -> Optional[float]:
        """Predicted emitted tokens per second of a step with drafts of length k (k = 0: plain decoding)."""
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
        share of a verify row plus a draft step, over the time per token of plain decoding (it grows
        with the batch: docs/decisions.md#cost-model)."""
        t_plain, t_more = self.step_seconds(batch, batch), self.step_seconds(2 * batch, batch)
        t_draft = self.draft_step_seconds(batch)
        if t_plain is None or t_more is None:
            return None
        if t_draft is None:  # before the first draft step is timed
            t_draft = DRAFT_COST_GUESS * self.step_seconds(1)
        t_row = max(0.0, t_more - t_plain) / batch
        return min(1.0, (batch * t_row + t_draft) / t_plain)

    def rows_can_pay(self, batch: int, max_rows: int) -> bool:
        """Whether some number n <= max_rows of verify rows on top of a plain step of `batch` sequences
        could pay for itself even if every drafted token were certain (n tokens against the plain
        tokens their time would give): the bound select_drafts cannot beat. At batch 16 on the 2-core
        CPU a 17th row costs more than a plain token (the products are compute-bound past ~8 rows), so
        no draft, lookup or probe there can be verified, and proposing them is pure overhead."""
        curve = self.step_curve(batch, batch + max_rows, batch)
        if curve is None:
            return True  # unmeasured: let the drafting path decide
        plain_rate = batch / curve[0]
        return any(n > plain_rate * (t - curve[0]) for n, t in enumerate(curve[1:], start=1))

    def best_len(self, batch: int, k: int, margin: float = 1.05, **kw) -> Optional[int]:
        """The draft length <= k with the most predicted tokens per second (None: not measured yet).
        Drafting must beat plain decoding by `margin`: a bet predicted to break even loses on average
        (the prediction leaves out probes and catch-up work)."""
        rates = [self.tokens_per_second(batch, j, **kw) for j in range(k + 1)]
        if any(r is None for r in rates):
            return None
        best = max(range(k + 1), key=lambda j: (rates[j], -j))
        return best if rates[best] > margin * rates[0] else 0


def _between_keys(keys: list[int], x: int) -> bool:
    """Whether x lies strictly between the first and the last of the sorted keys."""
    return len(keys) >= 2 and keys[0] < x < keys[-1]
