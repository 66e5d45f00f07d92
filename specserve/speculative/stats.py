"""What speculative decoding has done so far (`LLM.spec_stats()` reads it)."""
from __future__ import annotations

from dataclasses import dataclass, field
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
    drafted_at: list[int] = field(default_factory=list)  # [position]: drafts proposed at draft position i
    accepted_at: list[int] = field(default_factory=list)  # and accepted there
    tree_spans: int = 0  # verify spans that were token trees
    tree_nodes: int = 0  # their draft tokens
    speculating: bool = False  # whether the last decode step verified drafts (the cost model's live choice)

    def record_positions(self, drafted: list[int], accepted: list[int]) -> None:
        """Per verified sequence: drafts proposed (a tree's depth) and accepted (a prefix of them, a
        tree's accepted path): acceptance by draft position, by tree depth for a tree."""
        for n, a in zip(drafted, accepted):
            if n > len(self.drafted_at):
                grow = n - len(self.drafted_at)
                self.drafted_at += [0] * grow
                self.accepted_at += [0] * grow
            for i in range(n):
                self.drafted_at[i] += 1
                self.accepted_at[i] += i < a

    @property
    def alpha(self) -> Optional[float]:
        """Per-token acceptance rate, the maximum-likelihood estimate under a geometric model."""
        return self.accepted / (self.accepted + self.rejections) if self.accepted + self.rejections else None

    @property
    def mean_draft_len(self) -> Optional[float]:
        """Draft tokens per verified sequence (a tree's nodes)."""
        return self.drafted / self.drafted_at[0] if self.drafted_at and self.drafted_at[0] else None

    @property
    def acceptance_rate(self) -> Optional[float]:
        return self.accepted / self.drafted if self.drafted else None

    def as_dict(self) -> dict:
        return {"target_steps": self.target_steps, "spec_steps": self.spec_steps, "fallback_steps": self.fallback_steps,
                "drafted": self.drafted, "accepted": self.accepted, "alpha": self.alpha,
                "acceptance_rate": self.acceptance_rate,
                "tokens_per_target_step": self.decode_tokens / self.decode_seq_steps if self.decode_seq_steps else None,
                "draft_seconds": round(self.draft_seconds, 4), "target_seconds": round(self.target_seconds, 4),
                "acceptance_by_position": [a / d for a, d in zip(self.accepted_at, self.drafted_at)],
                "tree_spans": self.tree_spans,
                "mean_tree_nodes": self.tree_nodes / self.tree_spans if self.tree_spans else None,
                "speculating": self.speculating}
