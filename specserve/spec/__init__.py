"""Speculative decoding: the decoder that proposes, verifies and applies drafts inside the step loop
(decoder.py), the cost model that decides whether and how far to draft (cost_model.py), which of a
step's sequences draft (choice.py), which draft tokens a step verifies (selection.py), draft-length
policies (policies.py) and statistics (stats.py).
Drafting methods themselves live in `specserve.drafters`."""
from .cost_model import CostModel, calibrate, time_pass
from .decoder import DraftingStep, SpeculativeDecoder, Verified
from .policies import DraftLengthPolicy, make_policy
from .selection import select_drafts
from .stats import SpecStats

__all__ = ["CostModel", "DraftLengthPolicy", "DraftingStep", "SpecStats", "SpeculativeDecoder", "Verified",
           "calibrate", "make_policy", "select_drafts", "time_pass"]
