"""What the LLM mode's simulator (planner/llm.py) prices a step with: a model's measured pass times
(PassProfile), a draft's acceptance and cost (DraftSpec), and the speculation length a decode step
chooses from them (step_choice).

A step of b decoding sequences (each with k drafts to verify) and prompt chunks costs:
  whole prompts   pass(b * (k + 1) + prompt tokens): one curve over every token in the pass, the
                  decode batches' points below and whole prompts' above (`specserve profile --llm`)
  prompt chunks   pass(b * (k + 1)) + sum of chunk(c, n) - fixed, when the profile has its own prefill
                  curve: chunk(c, n) = prefill(n) * c / n, the share of a whole n-token prompt's
                  prefill (timed in the engine's own chunks) that c of its tokens take, and `fixed` =
                  2 pass(1) - pass(2), the per-pass cost the decode rows and the chunk share
                  (SARATHI's decode-maximal steps); without that curve, as whole prompts
  served          + step_s + token_s per sequence that streams a token this step, when the profile
                  was calibrated through a served replica (meta["served"]: what a step and a
                  streamed token cost the replica beyond the engine's pass)
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Optional

import numpy as np


@dataclass(frozen=True)
class PassProfile:
    """Seconds of one forward pass vs the tokens in it, and the memory the model needs."""

    model: str
    tokens: list[int]  # increasing
    seconds: list[float]
    weights_gb: float
    kv_gb_per_token: float
    meta: dict = field(default_factory=dict)
    # seconds to prefill a whole prompt of n tokens, in the engine's chunks (none: pass(n) stands in)
    prefill_tokens: list[int] = field(default_factory=list)
    prefill_seconds: list[float] = field(default_factory=list)

    def __post_init__(self):
        if len(self.tokens) < 2 or len(self.tokens) != len(self.seconds) or any(
                b <= a for a, b in zip(self.tokens, self.tokens[1:])):
            raise ValueError("a pass profile needs >= 2 points with increasing token counts")
        if len(self.prefill_tokens) != len(self.prefill_seconds) or len(self.prefill_tokens) == 1 or any(
                b <= a for a, b in zip(self.prefill_tokens, self.prefill_tokens[1:])):
            raise ValueError("a prefill curve needs none or >= 2 points with increasing prompt lengths")
        # timing noise can make a bigger pass read faster: a pass is never cheaper than a smaller one
        object.__setattr__(self, "_monotone", np.maximum.accumulate(np.asarray(self.seconds, dtype=float)))
        object.__setattr__(self, "_prefill", np.maximum.accumulate(np.asarray(self.prefill_seconds, dtype=float)))

    def pass_s(self, n: float) -> float:
        """Seconds for a pass over n tokens: interpolated between measured points, the first point's
        time below them, linear beyond the last."""
        t, s = self.tokens, self._monotone
        if n <= t[0]:
            return float(s[0])
        if n >= t[-1]:
            return float(s[-1] + (n - t[-1]) * (s[-1] - s[-2]) / (t[-1] - t[-2]))
        return float(np.interp(n, t, s))

    @property
    def chunked(self) -> bool:
        """Whether prompt chunks can be priced apart from decode rows (a prefill curve was measured)."""
        return bool(self.prefill_tokens)

    def prefill_s(self, n: float) -> float:
        """Seconds to prefill a whole n-token prompt: its curve, proportional below the first point,
        linear beyond the last; pass(n) without one."""
        if not self.prefill_tokens:
            return self.pass_s(n)
        t, s = self.prefill_tokens, self._prefill
        if n <= t[0]:
            return float(s[0] * n / t[0])
        if n >= t[-1]:
            return float(s[-1] + (n - t[-1]) * (s[-1] - s[-2]) / (t[-1] - t[-2]))
        return float(np.interp(n, t, s))

    def chunk_s(self, tokens: int, prompt: int) -> float:
        """Seconds `tokens` of an n-token prompt's prefill take: prefill(n) * tokens / n (module doc);
        pass(tokens) without a prefill curve."""
        if not self.prefill_tokens:
            return self.pass_s(tokens)
        return self.prefill_s(prompt) * tokens / prompt

    @property
    def fixed_s(self) -> float:
        """The per-pass cost a step's decode rows and prompt chunk share: 2 pass(1) - pass(2), >= 0."""
        return max(0.0, 2 * self.pass_s(1) - self.pass_s(2))

    def served_s(self, streams: int) -> float:
        """What a served replica's step costs beyond the pass, with `streams` sequences streaming a
        token (meta["served"], from `bench/placement_replay.py --calibrate`; 0 without it)."""
        served = self.meta.get("served") or {}
        return float(served.get("step_s", 0.0)) + float(served.get("token_s", 0.0)) * streams

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(asdict(self), f, indent=1)

    @classmethod
    def load(cls, path: str) -> "PassProfile":
        try:
            with open(path) as f:
                return cls(**json.load(f))
        except OSError as e:
            raise ValueError(f"{path}: cannot read pass profile ({e.strerror}); make one with "
                             "`specserve profile --llm`") from None
        except (json.JSONDecodeError, TypeError) as e:
            raise ValueError(f"{path}: not a specserve pass profile ({e})") from None


@dataclass(frozen=True)
class DraftSpec:
    """A draft that can sit beside its target: its memory and what `bench spec` measured."""

    alpha: float  # probability a drafted token is accepted, per position
    c: float  # one draft step / one target step at the same batch size
    weights_gb: float
    kv_gb_per_token: float
    max_len: int = 8

    def __post_init__(self):
        if not (0 <= self.alpha < 1 and 0 < self.c and self.max_len >= 1):
            raise ValueError(f"draft needs 0 <= alpha < 1, c > 0 and max_len >= 1 (got {self})")

    def expected_tokens(self, k: int) -> float:
        """Tokens a sequence gains from one verify of k drafts (accepted run + the target's own)."""
        return (1 - self.alpha ** (k + 1)) / (1 - self.alpha)

    @classmethod
    def from_spec_bench(cls, path: str, weights_gb: float, kv_gb_per_token: float, setting: str = "greedy",
                        max_len: int = 8) -> "DraftSpec":
        """alpha and c averaged over the batch sizes of a `specserve bench spec` result."""
        try:
            with open(path) as f:
                rows = json.load(f)["tables"][setting]
        except (OSError, KeyError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: no '{setting}' table of a `specserve bench spec` result ({e})") from None
        return cls(float(np.mean([r["alpha"] for r in rows])), float(np.mean([r["c"] for r in rows])),
                   weights_gb, kv_gb_per_token, max_len)


def step_choice(profile: PassProfile, draft: Optional[DraftSpec], batch: int) -> tuple[int, float, float]:
    """(draft length k, seconds, tokens each sequence gains) for a decode step of `batch` sequences
    (no prefill rows); k = 0 is plain decoding, chosen whenever speculating costs more per token."""
    plain = profile.pass_s(batch)
    best = (0, plain, 1.0)
    if draft is None or batch == 0:
        return best
    for k in range(1, draft.max_len + 1):
        t = k * draft.c * plain + profile.pass_s(batch * (k + 1))
        e = draft.expected_tokens(k)
        if t / e < best[1] / best[2]:
            best = (k, t, e)
    return best
