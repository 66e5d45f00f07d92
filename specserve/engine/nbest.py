"""n-best answers: which samples of a request make its answer, in what order.

OpenAI's `best_of` returns the samples with the highest log-probability per token; BASS (section
4.5) adds a time budget: samples race a deadline, and those finished by then are ranked by mean
log-probability, the first being the pick. Both are SamplingParams.ranked; this module is the one
place their answer is chosen, for LLM.generate and AsyncLLM alike. Plain Python.
"""
from __future__ import annotations

import math

from ..types import FinishReason, Request

_STOPPED = (FinishReason.DEADLINE, FinishReason.ABORT, FinishReason.ERROR)


def mean_logprob(r: Request) -> float:
    """The mean log-probability of r's output tokens (-inf without any)."""
    lps = r.output_logprobs
    return sum(lps) / len(lps) if lps else -math.inf


def pick(group: list[Request]) -> list[Request]:
    """The samples a request answers with, best first: for ranked params, the n of highest mean
    log-probability among those that finished (stop or length); if none finished before the deadline,
    among the stopped ones, so the answer is never empty. Ties go to the lower sample index (a seeded
    request answers the same every time). Unranked params: every sample, in order."""
    params = group[0].params
    if not params.ranked:
        return list(group)
    done = [r for r in group if r.finish_reason is not None and r.finish_reason not in _STOPPED]
    pool = done or list(group)
    pool.sort(key=lambda r: (-mean_logprob(r), r.sample_index))
    return pool[:params.n]
