"""Discrete-event simulation of model-parallel serving groups (AlpaServe, OSDI 2023, section 4).

A group is a set of devices running its models as a pipeline of `pp` stages. A request for model m
goes to the group serving m with the fewest outstanding requests; inside a group each stage serves
requests first-come first-served and is busy while it processes one, so the next request enters
stage 1 as soon as stage 1 is free (pipelining). A request that cannot finish by its deadline
(arrival + SLO) is dropped when it would start, as AlpaServe does, so it costs no device time.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np


@dataclass
class Group:
    """Devices serving `models` as a pipeline; stage_latency[m] lists model m's per-stage seconds."""

    devices: list[int]
    stage_latency: dict[str, list[float]]
    pp: int = 1
    op: int = 1

    @property
    def models(self) -> list[str]:
        return list(self.stage_latency)


@dataclass
class Request:
    arrival: float
    model: str


@dataclass
class SimResult:
    num_requests: int
    num_good: int  # finished within SLO
    latencies: np.ndarray  # of served requests, seconds
    finish: np.ndarray  # per request: finish time, NaN when dropped
    busy_time: dict[int, float]  # device -> seconds busy
    horizon: float
    per_model_good: dict[str, tuple[int, int]] = field(default_factory=dict)  # model -> (good, total)

    @property
    def slo_attainment(self) -> float:
        return self.num_good / self.num_requests if self.num_requests else 1.0

    def latency_percentile(self, q: float) -> Optional[float]:
        return float(np.percentile(self.latencies, q)) if len(self.latencies) else None

    @property
    def goodput(self) -> float:
        return self.num_good / self.horizon if self.horizon > 0 else 0.0

    def utilisation(self) -> dict[int, float]:
        return {d: t / self.horizon for d, t in self.busy_time.items()} if self.horizon > 0 else {}


def simulate(groups: Sequence[Group], requests: Sequence[Request], slo: dict[str, float]) -> SimResult:
    """Requests must be sorted by arrival. slo[m]: latency budget of model m in seconds."""
    serving: dict[str, list[int]] = {}
    for gi, g in enumerate(groups):
        for m in g.models:
            serving.setdefault(m, []).append(gi)
    stage_free = [[0.0] * g.pp for g in groups]  # when each stage of each group is next free
    outstanding = [deque() for _ in groups]  # finish times of requests still in the group (sorted)
    busy = {d: 0.0 for g in groups for d in g.devices}
    finish = np.full(len(requests), np.nan)
    good = 0
    lat = []
    per_model: dict[str, list[int]] = {}
    last_arrival = 0.0
    for i, r in enumerate(requests):
        if r.arrival < last_arrival:
            raise ValueError("requests must be sorted by arrival time")
        last_arrival = r.arrival
        stats = per_model.setdefault(r.model, [0, 0])
        stats[1] += 1
        candidates = serving.get(r.model)
        if not candidates:
            continue  # no group serves this model: the request fails its SLO
        for gi in candidates:
            q = outstanding[gi]
            while q and q[0] <= r.arrival:
                q.popleft()
        gi = min(candidates, key=lambda c: (len(outstanding[c]), c))
        g, free = groups[gi], stage_free[gi]
        stages = g.stage_latency[r.model]
        # Walk the stages: each starts when the request left the previous one and the stage is free.
        t, starts = r.arrival, []
        for s, dur in enumerate(stages):
            t = max(t, free[s])
            starts.append(t)
            t += dur
        if t - r.arrival > slo[r.model] + 1e-12:
            continue  # dropped: would miss its deadline
        for s, dur in enumerate(stages):
            free[s] = starts[s] + dur
        per_stage = max(1, len(g.devices) // g.pp)
        for s, dur in enumerate(stages):
            for d in g.devices[s * per_stage:(s + 1) * per_stage]:
                busy[d] += dur
        finish[i] = t
        outstanding[gi].append(t)
        lat.append(t - r.arrival)
        good += 1
        stats[0] += 1
    end = max([r.arrival for r in requests] + [f for f in finish if not np.isnan(f)], default=0.0)
    start = requests[0].arrival if requests else 0.0
    return SimResult(len(requests), good, np.asarray(lat), finish, busy, end - start,
                     {m: (s[0], s[1]) for m, s in per_model.items()})
