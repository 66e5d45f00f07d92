"""Discrete-event simulation of model-parallel serving groups (AlpaServe, OSDI 2023, section 4).

A group is a set of devices running its models as a pipeline of `pp` stages. A request for model m
goes to the group serving m with the fewest outstanding requests (ties: the lower group index);
inside a group each stage serves requests first-come first-served and is busy while it processes
one, so the next request enters stage 1 as soon as stage 1 is free (pipelining). A request that
cannot finish by its deadline (arrival + SLO) is dropped when it arrives, as AlpaServe's
controller does, so it costs no device time.

The event loop is one numba-compiled pass over the requests: the placement search runs it
hundreds of thousands of times. Inside a group requests leave every stage in arrival order, so a
group's outstanding requests are a FIFO list (linked through `next_in_group`) and counting them
at a new arrival only pops finished ones off its head.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

import numpy as np

try:  # the planner's one dependency of its own: pip install 'specserve[planner]'
    import numba
except ImportError:
    numba = None

NEEDS_NUMBA = "the planner's simulator needs numba: pip install 'specserve[planner]'"


def _njit(**options):
    """numba.njit where numba is installed; without it the loop refuses to run, in one line, when
    called (the rest of specserve, the CLI's flags included, imports this module without it)."""
    if numba is not None:
        return numba.njit(**options)

    def refuse(f):
        def run(*args, **kwargs):
            raise ModuleNotFoundError(NEEDS_NUMBA)
        return run
    return refuse


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
class Arrival:
    arrival: float
    model: str


@dataclass
class Trace:
    """Requests as arrays, sorted by arrival: what the event loop reads."""

    arrival: np.ndarray  # [N] float64 seconds
    model: np.ndarray  # [N] int64, index into `models`
    models: list[str]

    @classmethod
    def from_requests(cls, requests: Sequence[Arrival], models: Optional[Sequence[str]] = None) -> "Trace":
        names = list(models) if models is not None else sorted({r.model for r in requests})
        index = {m: i for i, m in enumerate(names)}
        for r in requests:
            if r.model not in index:
                index[r.model] = len(names)
                names.append(r.model)
        arrival = np.asarray([r.arrival for r in requests], dtype=np.float64)
        if len(arrival) and np.any(np.diff(arrival) < 0):
            raise ValueError("requests must be sorted by arrival time")
        return cls(arrival, np.asarray([index[r.model] for r in requests], dtype=np.int64), names)

    def __len__(self) -> int:
        return len(self.arrival)

    def subset(self, models: Sequence[str]) -> "Trace":
        """Only the requests of `models`, re-indexed in that order."""
        old = {m: i for i, m in enumerate(self.models)}
        remap = np.full(len(self.models), -1, dtype=np.int64)
        for new_i, m in enumerate(models):
            if m in old:
                remap[old[m]] = new_i
        keep = remap[self.model] >= 0
        return Trace(self.arrival[keep], remap[self.model[keep]], list(models))


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


@_njit(cache=True, nogil=True)
def run_trace(arrival, model, slo, served, stage_lat, num_stages, extra_group, extra_model, extra_lat,
              finish, stage_busy):
    """One pass over the requests; returns how many met their SLO.

    arrival [N], model [N], slo [M]; served [G, M] bool; stage_lat [G, M, P] seconds; num_stages [G].
    (extra_group, extra_model, extra_lat [P]) adds one more replica without copying the placement
    (the search scores many one-replica changes of the same placement); extra_group = -1: none.
    Writes finish [N] (NaN: dropped) and adds device-seconds into stage_busy [G, P].
    """
    n, num_groups, num_models = arrival.shape[0], served.shape[0], served.shape[1]
    # groups serving each model, in group order (CSR)
    ptr = np.zeros(num_models + 1, np.int64)
    for g in range(num_groups):
        for m in range(num_models):
            if served[g, m] or (g == extra_group and m == extra_model):
                ptr[m + 1] += 1
    for m in range(num_models):
        ptr[m + 1] += ptr[m]
    groups_of = np.empty(ptr[num_models], np.int64)
    fill = ptr[:num_models].copy()
    for g in range(num_groups):
        for m in range(num_models):
            if served[g, m] or (g == extra_group and m == extra_model):
                groups_of[fill[m]] = g
                fill[m] += 1
    stage_free = np.zeros((num_groups, stage_lat.shape[2]), np.float64)  # [G, P] when each stage is next free
    head = np.full(num_groups, -1, np.int64)  # oldest outstanding request of each group
    tail = np.full(num_groups, -1, np.int64)
    outstanding = np.zeros(num_groups, np.int64)
    next_in_group = np.full(n, -1, np.int64)
    starts = np.empty(stage_lat.shape[2], np.float64)
    good = 0
    for i in range(n):
        t, m = arrival[i], model[i]
        best, best_count = -1, n + 1
        for k in range(ptr[m], ptr[m + 1]):
            g = groups_of[k]
            while head[g] >= 0 and finish[head[g]] <= t:
                head[g] = next_in_group[head[g]]
                outstanding[g] -= 1
            if head[g] < 0:
                tail[g] = -1  # drained: the next request starts a new list (else it links from a stale tail)
            if outstanding[g] < best_count:
                best, best_count = g, outstanding[g]
        finish[i] = np.nan
        if best < 0:
            continue  # nobody serves this model: the request fails its SLO
        lat = extra_lat if (best == extra_group and m == extra_model) else stage_lat[best, m]
        done = t
        for s in range(num_stages[best]):
            if stage_free[best, s] > done:
                done = stage_free[best, s]
            starts[s] = done
            done += lat[s]
        if done - t > slo[m] + 1e-12:
            continue  # dropped: would miss its deadline
        for s in range(num_stages[best]):
            stage_free[best, s] = starts[s] + lat[s]
            stage_busy[best, s] += lat[s]
        finish[i] = done
        if tail[best] >= 0:
            next_in_group[tail[best]] = i
        else:
            head[best] = i
        tail[best] = i
        outstanding[best] += 1
        good += 1
    return good


@_njit(cache=True, parallel=True)
def score_additions(arrival, model, slo, served, stage_lat, num_stages, add_group, add_model, add_lat):
    """For each one-replica change (add_group[c], add_model[c], add_lat[c]): the requests within SLO
    and the sum of their latencies (the search's tie-break) -> ([C] int64, [C] float64)."""
    num = add_group.shape[0]
    good = np.zeros(num, np.int64)
    lat_sum = np.zeros(num, np.float64)
    for c in numba.prange(num):
        finish = np.empty(arrival.shape[0], np.float64)
        busy = np.zeros((served.shape[0], stage_lat.shape[2]), np.float64)
        good[c] = run_trace(arrival, model, slo, served, stage_lat, num_stages, add_group[c], add_model[c],
                            add_lat[c], finish, busy)
        total = 0.0
        for i in range(arrival.shape[0]):
            if finish[i] == finish[i]:  # not NaN: served
                total += finish[i] - arrival[i]
        lat_sum[c] = total
    return good, lat_sum


def simulate(groups: Sequence[Group], requests: Union[Trace, Sequence[Arrival]], slo: dict[str, float]) -> SimResult:
    """Requests must be sorted by arrival. slo[m]: latency budget of model m in seconds."""
    trace = requests if isinstance(requests, Trace) else Trace.from_requests(requests)
    models = list(trace.models)
    for g in groups:
        models += [m for m in g.models if m not in models]
    index = {m: i for i, m in enumerate(models)}
    max_pp = max([g.pp for g in groups] + [len(s) for g in groups for s in g.stage_latency.values()] + [1])
    served = np.zeros((len(groups), len(models)), dtype=np.bool_)
    stage_lat = np.zeros((len(groups), len(models), max_pp))
    for gi, g in enumerate(groups):
        for m, stages in g.stage_latency.items():
            served[gi, index[m]] = True
            stage_lat[gi, index[m], :len(stages)] = stages
    num_stages = np.asarray([max([g.pp] + [len(s) for s in g.stage_latency.values()]) for g in groups], dtype=np.int64)
    slo_arr = np.asarray([slo.get(m, np.inf) for m in models], dtype=np.float64)
    finish = np.empty(len(trace))
    stage_busy = np.zeros((len(groups), max_pp))
    good = run_trace(trace.arrival, trace.model, slo_arr, served, stage_lat, num_stages, -1, -1,
                     np.zeros(max_pp), finish, stage_busy)
    busy = {d: 0.0 for g in groups for d in g.devices}
    for gi, g in enumerate(groups):
        per_stage = max(1, len(g.devices) // num_stages[gi])
        for s in range(num_stages[gi]):
            for d in g.devices[s * per_stage:(s + 1) * per_stage]:
                busy[d] += float(stage_busy[gi, s])
    served_mask = ~np.isnan(finish)
    totals = np.bincount(trace.model, minlength=len(trace.models))
    goods = np.bincount(trace.model[served_mask], minlength=len(trace.models))
    per_model = {m: (int(goods[i]), int(totals[i])) for i, m in enumerate(trace.models) if totals[i]}
    arrival = trace.arrival
    end = max(float(arrival.max()) if len(arrival) else 0.0, float(np.nanmax(finish)) if served_mask.any() else 0.0)
    start = float(arrival[0]) if len(arrival) else 0.0
    return SimResult(len(trace), int(good), finish[served_mask] - arrival[served_mask], finish, busy, end - start,
                     per_model)
