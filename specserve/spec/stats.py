"""What speculative decoding has done so far (`LLM.spec_stats()` reads it)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class SpecStats:
    target_steps: int = 0
    spec_steps: int = 0  # target steps that verified drafts
    fallback_steps: int = 0  # decode steps where the cost model chose not to draft
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0  # verify spans that ended in a rejection (not all drafts accepted)
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    decode_tokens: int = 0  # tokens emitted by decode steps (spec or not)
    decode_seq_steps: int = 0  # (sequence, decode step) pairs

    @property
    def alpha(self) -> Optional[float]:
        """Per-token acceptance rate, the maximum-likelihood estimate under a geometric model."""
        return self.accepted / (self.accepted + self.rejections) if self.accepted + self.rejections else None

    @property
    def acceptance_rate(self) -> Optional[float]:
        return self.accepted / self.drafted if self.drafted else None

    def as_dict(self) -> dict:
        return {"target_steps": self.target_steps, "spec_steps": self.spec_steps, "fallback_steps": self.fallback_steps,
                "drafted": self.drafted, "accepted": self.accepted, "alpha": self.alpha,
                "acceptance_rate": self.acceptance_rate,
                "tokens_per_target_step": self.decode_tokens / self.decode_seq_steps if self.decode_seq_steps else None,
                "draft_seconds": round(self.draft_seconds, 4), "target_seconds": round(self.target_seconds, 4)}
