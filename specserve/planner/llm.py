"""LLM serving on the planner's devices: generations, continuous batching, TTFT / TPOT SLOs, KV
memory, and speculative decoding priced step by step.

AlpaServe prices a request as one fixed latency. An LLM request is a generation: a prefill of its
prompt, then one decode step per output token, batched with whatever else its replica runs
(continuous batching). Its follow-ups split the SLO (DistServe: time to first token and time per
output token), count KV-cache memory (MuxServe, Llumnix); none of them places a draft model. Here a
replica may carry its draft, and every decode step chooses how far to speculate, or not at all,
from the batch size it has at that moment: the choice BASS makes, priced with the measured pass
times, acceptance rate alpha and draft cost ratio c.

Costs (measured: `specserve profile --llm`; alpha and c from `specserve bench spec`; the formulas in
planner/llm_costs.py): a step of b decoding sequences with k drafts each, plus prompt tokens, costs
about pass(b * (k + 1) + prompt tokens); each sequence gains E(k) = (1 - alpha^(k+1)) / (1 - alpha)
tokens in expectation, and the step uses the k in 0..max_len (0: plain) with the least time per token
at batch b. Prompts go in whole, or in SARATHI's chunks beside the decodes as the engine runs them
(`prefill_chunk`).
Memory per device: weights of its targets and drafts; the rest is KV cache, which a generation
reserves for its prompt + output on admission (target KV, plus the draft's when it speculates).
Outputs advance by expected tokens (fractions), so a run is deterministic for a seeded workload.
"""
from __future__ import annotations

import csv
import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from .llm_costs import DraftSpec, PassProfile, step_choice
from .workload import _parse_time, gamma_arrivals, power_law_weights


@dataclass
class Generation:
    arrival: float
    model: str
    prompt_tokens: int
    output_tokens: int


# Medians the Splitwise paper reports for the Azure LLM inference trace (2023): prompt and output
# tokens of the conversation and the code service. The trace itself is not on this machine; a
# lognormal around each median stands in (sigma is ours), or pass the trace's CSV (--llm-trace).
AZURE_CONV_MEDIANS = (1020, 129)
AZURE_CODE_MEDIANS = (1500, 13)


def llm_workload(models: Sequence[str], rate: float, cv: float, duration: float, seed: int, skew: float = 0.0,
                 prompt_median: int = AZURE_CONV_MEDIANS[0], output_median: int = AZURE_CONV_MEDIANS[1],
                 sigma: float = 0.6, max_len: int = 4096) -> list[Generation]:
    rng = np.random.default_rng(seed)
    out = []
    for m, w in zip(models, power_law_weights(len(models), skew)):
        for t in gamma_arrivals(rate * w, cv, duration, rng):
            p = int(np.clip(rng.lognormal(math.log(prompt_median), sigma), 1, max_len // 2))
            o = int(np.clip(rng.lognormal(math.log(output_median), sigma), 1, max_len // 2))
            out.append(Generation(float(t), m, p, o))
    out.sort(key=lambda g: g.arrival)
    return out


def load_llm_trace(path: str, models: Sequence[str]) -> list[Generation]:
    """The Azure LLM inference trace's CSV (TIMESTAMP, ContextTokens, GeneratedTokens); rows go to
    the models round-robin."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        stamps = [_parse_time(r["TIMESTAMP"]) for r in rows]
        t0 = min(stamps)
        gens = [Generation(s - t0, models[i % len(models)], max(1, int(r["ContextTokens"])),
                           max(1, int(r["GeneratedTokens"]))) for i, (s, r) in enumerate(zip(stamps, rows))]
    except OSError as e:
        raise ValueError(f"{path}: cannot read trace ({e.strerror})") from None
    except (KeyError, ValueError) as e:
        raise ValueError(f"{path}: expected the Azure LLM trace's TIMESTAMP, ContextTokens, GeneratedTokens ({e})") from None
    gens.sort(key=lambda g: g.arrival)
    return gens


@dataclass
class LLMDevice:
    models: list[str] = field(default_factory=list)  # target replicas
    drafts: list[str] = field(default_factory=list)  # which of them carry their draft

    def weights_gb(self, profiles: dict, drafts: dict) -> float:
        return sum(profiles[m].weights_gb for m in self.models) + sum(drafts[m].weights_gb for m in self.drafts)


@dataclass(frozen=True)
class LLMSLO:
    ttft_s: float
    tpot_s: float


@dataclass
class LLMResult:
    ttft: np.ndarray  # [N] seconds, NaN: never served (no replica, or its KV cannot hold it)
    tpot: np.ndarray  # [N] seconds per output token after the first
    good: np.ndarray  # [N] bool: both SLOs met
    steps: int
    spec_steps: int
    batch_hist: dict[int, int]  # decode batch size -> steps
    spec_by_batch: dict[int, int]  # decode batch size -> steps that speculated

    @property
    def slo_attainment(self) -> float:
        return float(self.good.mean()) if len(self.good) else 1.0

    def summary(self) -> dict:
        ok = ~np.isnan(self.ttft)
        pct = (lambda a, q: float(np.percentile(a[ok], q)) if ok.any() else None)  # noqa: E731
        return {"slo_attainment": self.slo_attainment, "ttft_p50_s": pct(self.ttft, 50), "ttft_p99_s": pct(self.ttft, 99),
                "tpot_p50_s": pct(self.tpot, 50), "tpot_p99_s": pct(self.tpot, 99), "steps": self.steps,
                "spec_share": self.spec_steps / self.steps if self.steps else 0.0,
                "mean_decode_batch": (sum(b * n for b, n in self.batch_hist.items()) / max(1, sum(self.batch_hist.values())))}


class _Replica:
    def __init__(self, model, profile, draft):
        self.model, self.profile, self.draft = model, profile, draft
        self.kv_per_token = profile.kv_gb_per_token + (draft.kv_gb_per_token if draft else 0.0)
        self.waiting: deque[int] = deque()
        self.prefill: list[list] = []  # admitted (KV held): [request, prompt tokens computed]
        self.running: list[list] = []  # [request, tokens still to produce]
        self.choice: dict[int, tuple] = {}  # decode batch -> step_choice

    def outstanding(self) -> int:
        return len(self.waiting) + len(self.prefill) + len(self.running)

    def step(self, b: int) -> tuple[int, float, float]:
        if b not in self.choice:
            self.choice[b] = step_choice(self.profile, self.draft, b)
        return self.choice[b]


def simulate_llm(devices: Sequence[LLMDevice], gens: Sequence[Generation], profiles: dict[str, PassProfile],
                 drafts: dict[str, DraftSpec], slo: dict[str, LLMSLO], budget_gb: float,
                 max_num_seqs: int = 64, max_prefill_tokens: int = 4096, sharing: str = "processor",
                 prefill_chunk: Optional[int] = None, block_size: int = 16, switch_cost: float = 0.0) -> LLMResult:
    """Continuous batching on every device: a replica's step admits waiting generations (FIFO, while KV
    and max_num_seqs allow, up to max_prefill_tokens of prompt) as prefill rows beside the decode rows
    of those already running. Replicas on one device share it (`sharing`):
      "processor"  each replica steps on its own, all at once, each at 1/n of the device's speed while
                   n of them have a step in flight: what the OS does with replica processes on shared
                   cores (a served placement: one Ray actor per replica); while n >= 2 share it, each
                   runs at 1 / (n * (1 + switch_cost)): switch_cost is the work the processes' switching
                   adds (caches refilled; measured by `bench/placement_replay.py --calibrate`)
      "turns"      one replica's step at a time, taking the replicas in turn (one process stepping them)
    A generation goes to the replica of its model whose device holds the fewest generations (over all
    its replicas: they share its time), then the one with the fewest itself, then the lower index.
    prefill_chunk: None admits whole prompts in one step; a number runs the engine's scheduler
    (scheduler/scheduler.py): after the decode tokens, prompt tokens up to max(prefill_chunk - decode
    tokens, block_size), the prompts already started first, then waiting ones, a prompt split over
    steps; its first token comes with the step that ends it."""
    if sharing not in ("processor", "turns"):
        raise ValueError(f"sharing is 'processor' or 'turns', not {sharing!r}")
    n = len(gens)
    ttft, finish = np.full(n, np.nan), np.full(n, np.nan)
    reps, on_device = [], []
    kv_free = []  # GB of KV cache free per device
    for d, dev in enumerate(devices):
        free = budget_gb - dev.weights_gb(profiles, drafts)
        if free < -1e-9:
            raise ValueError(f"device {d} holds {dev.weights_gb(profiles, drafts):.3f} GB of weights, over its "
                             f"{budget_gb:g} GB budget")
        kv_free.append(free)
        on_device.append([])
        for m in dev.models:
            on_device[d].append(len(reps))
            reps.append(_Replica(m, profiles[m], drafts[m] if m in dev.drafts else None))
    kv_cap = list(kv_free)
    rep_device = [d for d, rs in enumerate(on_device) for _ in rs]
    of_model: dict[str, list[int]] = {}
    for i, r in enumerate(reps):
        of_model.setdefault(r.model, []).append(i)
    turn = [0] * len(devices)
    # steps in flight per device: replica -> [seconds of work left at the device's full speed, [(generation,
    # prompt tokens it computes)], tokens each decode gains]; `last`: when the work left was brought up to date
    active: list[dict[int, list]] = [{} for _ in devices]
    last = [0.0] * len(devices)
    version = [0] * len(devices)
    events: list = []  # (a device's next step end, its version then, device); an older version is stale
    stats = {"steps": 0, "spec": 0, "hist": {}, "spec_hist": {}}

    def launch(ri: int, d: int) -> Optional[list]:
        """Replica ri's next step ([seconds, [(generation, prompt tokens it computes)], tokens each
        decode gains]), or None when it has nothing to run."""
        r = reps[ri]
        b = len(r.running)
        k, _, gain = r.step(b) if b else (0, 0.0, 1.0)
        if prefill_chunk is None:
            budget = max_prefill_tokens
        else:
            used = b * (k + 1)
            budget = max(0, min(max_prefill_tokens - used, max(prefill_chunk - used, block_size)))
        chunks, prefill = [], 0
        for item in r.prefill:  # prompts already started (chunk mode only) go on first
            take = min(gens[item[0]].prompt_tokens - item[1], budget - prefill)
            if take <= 0:
                break
            chunks.append((item[0], take))
            prefill += take
        while (r.waiting and len(r.running) + len(r.prefill) < max_num_seqs and budget > 0
               and (prefill < budget or not chunks)):
            g = gens[r.waiting[0]]
            need = (g.prompt_tokens + g.output_tokens) * r.kv_per_token
            if need > kv_free[d] + 1e-12:
                break
            if prefill_chunk is None:
                if chunks and prefill + g.prompt_tokens > max_prefill_tokens:
                    break
                take = g.prompt_tokens
            else:
                take = min(g.prompt_tokens, budget - prefill)
            kv_free[d] -= need
            r.prefill.append([r.waiting.popleft(), 0])
            chunks.append((r.prefill[-1][0], take))
            prefill += take
        if not chunks and b == 0:
            return None
        prof = r.profile
        if prefill_chunk is None or not prof.chunked:
            seconds = prof.pass_s(b * (k + 1) + prefill)
            draft_prefill = prof.pass_s(prefill) if prefill else 0.0
        else:
            draft_prefill = sum(prof.chunk_s(n, gens[i].prompt_tokens) for i, n in chunks)
            seconds = (prof.pass_s(b * (k + 1)) if b else 0.0) + draft_prefill - (prof.fixed_s if b and chunks else 0.0)
        if r.draft is not None:  # the draft drafts for the decodes and prefills the new prompt tokens
            seconds += r.draft.c * (k * prof.pass_s(b) + draft_prefill)
        ends = sum(1 for item, (_, n) in zip(r.prefill, chunks) if item[1] + n >= gens[item[0]].prompt_tokens)
        seconds += prof.served_s(b + ends)
        stats["steps"] += 1
        if b:
            stats["hist"][b] = stats["hist"].get(b, 0) + 1
            if k:
                stats["spec"] += 1
                stats["spec_hist"][b] = stats["spec_hist"].get(b, 0) + 1
        return [seconds, chunks, gain]

    def slowdown(d: int) -> float:
        """Seconds of the device's time a second of a step's work takes while its steps share it."""
        n = len(active[d])
        return n * (1 + switch_cost) if n >= 2 else float(n)

    def advance(d: int, t: float) -> None:
        if active[d]:
            done = (t - last[d]) / slowdown(d)
            for step in active[d].values():
                step[0] -= done
        last[d] = t

    def fill(d: int, now: float, stepped: bool = False) -> None:
        """Start the steps device d can run now and, when its steps changed (one ended: `stepped`, or
        one started), schedule its next step end; otherwise the scheduled one still holds."""
        rs = on_device[d]
        order = [rs[(turn[d] + j) % len(rs)] for j in range(len(rs))]
        started = False
        for j, ri in enumerate(order):
            if sharing == "turns" and active[d]:
                break
            if ri not in active[d] and (step := launch(ri, d)) is not None:
                active[d][ri] = step
                started = True
                if sharing == "turns":
                    turn[d] = (turn[d] + j + 1) % len(rs)
        if sharing == "processor":
            turn[d] = (turn[d] + 1) % len(rs)  # who admits first (the device's KV) rotates
        if active[d] and (started or stepped):
            version[d] += 1
            end = now + min(step[0] for step in active[d].values()) * slowdown(d)
            heapq.heappush(events, (end, version[d], d))

    def on_event(t: float, ver: int, d: int) -> None:
        if ver != version[d]:
            return
        advance(d, t)
        for ri in [ri for ri, step in active[d].items() if step[0] <= 1e-9]:
            _, chunks, gain = active[d].pop(ri)
            finish_step(t, d, ri, chunks, gain)
        fill(d, t, stepped=True)

    def finish_step(t: float, d: int, ri: int, chunks: list[tuple[int, int]], gain: float) -> None:
        r = reps[ri]
        still = []
        for item in r.running:
            item[1] -= gain
            if item[1] <= 1e-9:
                _done(item[0], t, d, r)
            else:
                still.append(item)
        computed = dict(chunks)
        prefill = []
        for item in r.prefill:
            item[1] += computed.get(item[0], 0)
            if item[1] < gens[item[0]].prompt_tokens:
                prefill.append(item)
                continue
            i = item[0]
            ttft[i] = t
            left = gens[i].output_tokens - 1
            if left <= 0:
                _done(i, t, d, r)
            else:
                still.append([i, float(left)])
        r.running, r.prefill = still, prefill

    def _done(i: int, t: float, d: int, r: _Replica) -> None:
        finish[i] = t
        kv_free[d] += (gens[i].prompt_tokens + gens[i].output_tokens) * r.kv_per_token

    for i, g in enumerate(gens):
        while events and events[0][0] <= g.arrival:
            on_event(*heapq.heappop(events))
        # replicas whose device could hold this generation's KV at all (else it would block the queue)
        cands = [c for c in of_model.get(g.model, [])
                 if (g.prompt_tokens + g.output_tokens) * reps[c].kv_per_token <= kv_cap[rep_device[c]] + 1e-12]
        if not cands:
            continue
        ri = min(cands, key=lambda c: (sum(reps[o].outstanding() for o in on_device[rep_device[c]]),
                                       reps[c].outstanding(), c))
        reps[ri].waiting.append(i)
        d = rep_device[ri]
        advance(d, g.arrival)
        fill(d, g.arrival)
    while events:
        on_event(*heapq.heappop(events))

    arrival = np.asarray([g.arrival for g in gens])
    out_tokens = np.asarray([g.output_tokens for g in gens])
    tpot = np.where(out_tokens > 1, (finish - ttft) / np.maximum(out_tokens - 1, 1), 0.0)
    ttft_rel = ttft - arrival
    lim_ttft = np.asarray([slo[g.model].ttft_s for g in gens])
    lim_tpot = np.asarray([slo[g.model].tpot_s for g in gens])
    good = ~np.isnan(finish) & (ttft_rel <= lim_ttft + 1e-12) & (tpot <= lim_tpot + 1e-12)
    return LLMResult(ttft_rel, tpot, good, stats["steps"], stats["spec"], stats["hist"], stats["spec_hist"])
