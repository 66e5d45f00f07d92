"""Speculation-aware placement for LLM serving (`specserve plan --llm`).

The greedy fill of AlpaServe's search, on LLM costs (planner/llm.py), with two kinds of step: put
another replica of a model on a device, or give a replica its draft. Each step simulates every
candidate (one per set of interchangeable devices) and takes the one with the most generations
within both SLOs, then the most served, then the lower mean TTFT; it goes on while anything fits and keeps the best
placement seen. With drafts off it is the best placement without speculation; the log of each step
shows, side by side, the best draft and the best extra replica the step could have added.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .llm import AZURE_CODE_MEDIANS, AZURE_CONV_MEDIANS, LLMSLO, DraftSpec, Generation, LLMDevice, LLMResult, PassProfile, simulate_llm


@dataclass
class LLMPlan:
    devices: list[LLMDevice]
    result: LLMResult
    steps: list[dict] = field(default_factory=list)  # what each greedy step chose between
    planning_time_s: float = 0.0
    simulations: int = 0


def _key(res: LLMResult) -> tuple:
    ok = ~np.isnan(res.ttft)  # nothing served ranks below serving late
    return (int(res.good.sum()), int(ok.sum()), -float(np.mean(res.ttft[ok])) if ok.any() else 0.0)


def plan_llm(models: Sequence[str], num_devices: int, gens: Sequence[Generation], profiles: dict[str, PassProfile],
             drafts: dict[str, DraftSpec], slo: dict[str, LLMSLO], budget_gb: float, allow_drafts: bool = True,
             max_steps: int = 64, **sim_kw) -> LLMPlan:
    t0 = time.perf_counter()
    state = [LLMDevice() for _ in range(num_devices)]
    sims = 0

    def run(devs):
        nonlocal sims
        sims += 1
        return simulate_llm(devs, gens, profiles, drafts, slo, budget_gb, **sim_kw)

    longest = max((g.prompt_tokens + g.output_tokens for g in gens), default=0)

    def fits(dev: LLMDevice, extra_gb: float, kv_per_token: float) -> bool:
        # room for the weights and for the KV of this workload's longest generation
        return dev.weights_gb(profiles, drafts) + extra_gb + longest * kv_per_token <= budget_gb + 1e-12

    best = (run(state), copy.deepcopy(state))
    log = []
    for _ in range(max_steps):
        cands, seen = [], set()
        for d, dev in enumerate(state):
            key = (tuple(sorted(dev.models)), tuple(sorted(dev.drafts)))
            if key in seen:
                continue  # same contents as an earlier device: the same candidates
            seen.add(key)
            for m in models:
                p = profiles[m]
                if m not in dev.models and fits(dev, p.weights_gb, p.kv_gb_per_token):
                    cands.append(("replica", d, m))
                if (allow_drafts and m in dev.models and m not in dev.drafts and m in drafts
                        and fits(dev, drafts[m].weights_gb, p.kv_gb_per_token + drafts[m].kv_gb_per_token)):
                    cands.append(("draft", d, m))
        if not cands:
            break
        scored = []
        for kind, d, m in cands:
            trial = copy.deepcopy(state)
            (trial[d].models if kind == "replica" else trial[d].drafts).append(m)
            scored.append((_key(res := run(trial)), kind, d, m, res, trial))
        scored.sort(key=lambda c: c[0], reverse=True)
        top = scored[0]
        entry = {"chose": f"{top[1]} of {top[3]} on device {top[2]}", "attainment": top[4].slo_attainment}
        for kind in ("replica", "draft"):
            alt = next((c for c in scored if c[1] == kind), None)
            if alt is not None:
                entry[f"best_{kind}"] = {"what": f"{kind} of {alt[3]} on device {alt[2]}",
                                         "attainment": alt[4].slo_attainment}
        log.append(entry)
        state = top[5]
        if top[0] > _key(best[0]):
            best = (top[4], copy.deepcopy(state))
    return LLMPlan(best[1], best[0], log, time.perf_counter() - t0, sims)


@dataclass(frozen=True)
class Scenario:
    """A worked example: models, devices, load and SLOs (as multiples of measured times)."""

    name: str
    why: str
    models: int = 2
    devices: int = 2
    budget_gb: float = 1.2
    rate: float = 0.15  # generations/s over all models
    cv: float = 1.0
    duration: float = 1800.0
    ttft_scale: float = 5.0  # TTFT SLO = scale x the prefill of the median prompt
    tpot_scale: float = 1.0  # TPOT SLO = scale x one plain decode step at batch 1
    prompt_median: int = AZURE_CONV_MEDIANS[0]
    output_median: int = AZURE_CONV_MEDIANS[1]
    seed: int = 0


# Lengths: the medians Splitwise reports for the Azure LLM inference trace's two services.
SCENARIOS = {
    "conversation": Scenario(
        "conversation", "Azure conversation lengths, light load, a token every plain batch-1 step: batches stay "
        "small, where drafting is cheap and a draft lowers the time per token below what a replica can"),
    "code": Scenario(
        "code", "Azure code lengths (long prompts, ~13 output tokens): device time is prefill; a draft only "
        "speeds the few decode steps and prefills every prompt itself (c x the prompt's pass)",
        rate=0.2, tpot_scale=2.0, prompt_median=AZURE_CODE_MEDIANS[0],
        output_median=AZURE_CODE_MEDIANS[1]),
}
