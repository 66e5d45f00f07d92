"""Speculative decoding: the controller that proposes drafts and learns from each step (decoder.py),
the verifier, a pure function of drafts and logits (verify.py), the cost model that decides whether and
how far to draft (cost_model.py, a table of numbers) and its start-up timing (calibration.py), which of
a step's sequences draft (choice.py), which draft tokens a step verifies (selection.py), draft-length
policies (policies.py) and statistics (stats.py).
Drafting methods themselves live in `specserve.drafters`."""
from .calibration import Calibrator, calibrate, measure_prefill_chunk, time_pass
from .cost_model import CostModel
from .decoder import DraftingStep, Observed, SpeculativeDecoder, StepResult, VerifiedDraft
from .policies import DraftLengthPolicy, make_policy
from .selection import select_drafts
from .stats import SpecStats
from .verify import Verified, verify

__all__ = ["Calibrator", "CostModel", "DraftLengthPolicy", "DraftingStep", "Observed", "SpecStats", "SpeculativeDecoder",
           "StepResult", "Verified", "VerifiedDraft", "calibrate", "make_policy", "measure_prefill_chunk",
           "select_drafts", "time_pass", "verify"]
