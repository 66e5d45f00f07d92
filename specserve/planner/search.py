"""Placement policies: round-robin, selective replication, and AlpaServe's search.

AlpaServe (section 4.2, Algorithms 1 and 2):
- bucket models of similar latency (a new bucket where sorted latencies jump by more than
  `bucket_ratio`) and split the devices among buckets; buckets share no models and no devices,
  so each bucket's placement is searched alone and the split that serves the most requests wins;
- inside a bucket, enumerate ways to cut its devices into equal groups with a parallel configuration
  (power-of-two group sizes, every pp x op factorisation the cost model offers);
- fill each candidate by greedy model selection: repeatedly add the replica that most raises
  simulated SLO attainment, memory permitting, with a beam of the best partial placements.

Greedy selection as written simulates every (model, group) pair at every step; with 70 models on
64 devices that is thousands of simulations per replica. Two prunings keep a full sweep within
minutes: each step tries only the `model_candidates` models with the most requests missing their
SLO, and for each only the `group_candidates` least-loaded groups it fits in, one per set of
interchangeable groups (same configuration, same models). 0 turns a pruning off.

Selective replication is the greedy fill with every device its own group (a model too big for one
device gets the smallest pipeline it fits in, as AlpaServe's baseline does); round-robin ignores
the workload.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import numpy as np

from .cost_model import AnalyticCostModel
from .model_table import Cluster, ModelSpec
from .placement import GroupPlan, to_sim_groups
from .simulator import Trace, run_trace, score_additions, simulate

POLICIES = ("alpaserve", "selective-replication", "round-robin")


@dataclass(frozen=True)
class SearchConfig:
    beam: int = 1
    model_candidates: int = 4  # models tried per greedy step, most SLO misses first (0: all)
    group_candidates: int = 4  # groups tried per model, least loaded first (0: all)
    bucket_ratio: float = 2.0  # latency jump that starts a new bucket
    device_unit: int = 0  # bucket device counts are multiples of this (0: devices per node)

    def __post_init__(self):
        for name, lowest in (("beam", 1), ("model_candidates", 0), ("group_candidates", 0), ("device_unit", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lowest:
                raise ValueError(f"{name.replace('_', '-')} must be an integer >= {lowest}, got {v!r}")
        if not (isinstance(self.bucket_ratio, (int, float)) and 1 < self.bucket_ratio < float("inf")):
            raise ValueError(f"bucket-ratio must be a finite number > 1, got {self.bucket_ratio!r}")


@dataclass
class PlanResult:
    policy: str
    groups: list[GroupPlan]
    slo_attainment: float
    planning_time_s: float
    simulations: int = 0  # event-loop passes the search ran


class _Bucket:
    """Some models on groups of one parallel configuration, in the arrays the event loop reads."""

    def __init__(self, models: list[str], specs: dict[str, ModelSpec], trace: Trace, slo: dict[str, float],
                 costs, num_groups: int, pp: int, op: int, capacity_gb: float):
        self.models, self.trace = models, trace.subset(models)
        self.slo = np.asarray([slo[m] for m in models], dtype=np.float64)
        per_model = [costs.costs(specs[m], pp, op) for m in models]
        num_stages = max(len(c.stage_latency_s) for c in per_model)
        lat = np.zeros((len(models), num_stages))
        for i, c in enumerate(per_model):
            lat[i, :len(c.stage_latency_s)] = c.stage_latency_s
        self.lat = np.broadcast_to(lat, (num_groups, len(models), num_stages)).copy()  # [G, M, P]
        self.mem = np.asarray([c.memory_per_device_gb for c in per_model])  # [M] GB per device
        self.num_stages = np.full(num_groups, num_stages, dtype=np.int64)
        self.capacity = capacity_gb + 1e-9
        self.requests = np.bincount(self.trace.model, minlength=len(models))  # [M]
        self.work = self.requests * lat.max(axis=1)  # [M] bottleneck-stage seconds a group spends on m
        self.simulations = 0

    def good(self, served: np.ndarray) -> tuple[int, np.ndarray]:
        """Requests within SLO, in total and per model [M]."""
        finish = np.empty(len(self.trace))
        busy = np.zeros((served.shape[0], self.lat.shape[2]))
        total = run_trace(self.trace.arrival, self.trace.model, self.slo, served, self.lat, self.num_stages,
                          -1, -1, self.lat[0, 0], finish, busy)
        self.simulations += 1
        ok = ~np.isnan(finish)
        return int(total), np.bincount(self.trace.model[ok], minlength=len(self.models))

    def candidates(self, served: np.ndarray, per_model_good: np.ndarray, cfg: SearchConfig) -> list[tuple[int, int]]:
        """(group, model) additions worth simulating from this placement."""
        missing = self.requests - per_model_good
        order = [int(m) for m in np.argsort(-missing, kind="stable") if missing[m] > 0]
        used = served @ self.mem  # [G]
        load = served @ self.work  # [G]
        out = []
        for m in order:
            fits = np.flatnonzero(~served[:, m] & (used + self.mem[m] <= self.capacity))
            seen, groups = set(), []
            for g in fits[np.argsort(load[fits], kind="stable")]:
                key = served[g].tobytes()  # groups with the same models are interchangeable
                if key not in seen:
                    seen.add(key)
                    groups.append(int(g))
            groups = groups[:cfg.group_candidates or None]
            if groups:
                out += [(g, m) for g in groups]
                if cfg.model_candidates and len({mm for _, mm in out}) >= cfg.model_candidates:
                    break
        return out

    def greedy(self, served: np.ndarray, cfg: SearchConfig) -> tuple[np.ndarray, int]:
        best_good, per_model = self.good(served)
        best, frontier = served, [(served, per_model)]
        while frontier:
            scored = []
            for state, per_model in frontier:
                cands = self.candidates(state, per_model, cfg)
                if not cands:
                    continue
                g_idx = np.asarray([g for g, _ in cands], dtype=np.int64)
                m_idx = np.asarray([m for _, m in cands], dtype=np.int64)
                goods = score_additions(self.trace.arrival, self.trace.model, self.slo, state, self.lat,
                                        self.num_stages, g_idx, m_idx, self.lat[g_idx, m_idx])
                self.simulations += len(cands)
                scored += [(int(v), state, g, m) for v, g, m in zip(goods, g_idx, m_idx)]
            scored.sort(key=lambda c: -c[0])
            top = scored[:cfg.beam]
            if not top or top[0][0] <= best_good:
                break
            frontier = []
            for _, state, g, m in top:
                new = state.copy()
                new[g, m] = True
                frontier.append((new, self.good(new)[1]))
            best_good, best = top[0][0], frontier[0][0]
        return best, best_good


def partitions(num_devices: int, costs=None) -> list[tuple[int, int, int]]:
    """(group size, pp, op) with power-of-two group sizes dividing the devices."""
    out, size = [], 1
    while size <= num_devices:
        if num_devices % size == 0:
            out += [(size, pp, size // pp) for pp in range(1, size + 1)
                    if size % pp == 0 and (costs is None or costs.supports(pp, size // pp))]
        size *= 2
    return out


def buckets(specs: dict[str, ModelSpec], ratio: float) -> list[list[str]]:
    """Models sorted by latency, cut where the latency grows by more than `ratio`."""
    order = sorted(specs, key=lambda m: specs[m].latency_s)
    out = [[order[0]]] if order else []
    for prev, m in zip(order, order[1:]):
        if specs[m].latency_s > ratio * specs[prev].latency_s:
            out.append([])
        out[-1].append(m)
    return out


class _Planner:
    def __init__(self, specs, cluster: Cluster, trace: Trace, slo, costs, cfg: SearchConfig):
        self.specs, self.cluster, self.trace, self.slo, self.costs, self.cfg = specs, cluster, trace, slo, costs, cfg
        self.simulations = 0

    def fill(self, models: list[str], num_devices: int, size: int, pp: int, op: int) -> tuple[int, list[GroupPlan]]:
        """Greedy fill of num_devices / size groups (device ids relative to 0)."""
        num_groups = num_devices // size
        b = _Bucket(models, self.specs, self.trace, self.slo, self.costs, num_groups, pp, op,
                    self.cluster.device_memory_gb)
        served, good = b.greedy(np.zeros((num_groups, len(models)), dtype=np.bool_), self.cfg)
        self.simulations += b.simulations
        plans = [GroupPlan(list(range(g * size, (g + 1) * size)), pp, op, [models[m] for m in np.flatnonzero(served[g])])
                 for g in range(num_groups)]
        return good, plans

    def best_partition(self, models: list[str], num_devices: int) -> tuple[int, list[GroupPlan]]:
        best = (-1, [GroupPlan([d], 1, 1) for d in range(num_devices)])  # nothing fits: devices stay empty
        total = int(np.isin(self.trace.model, [self.trace.models.index(m) for m in models]).sum())
        for size, pp, op in partitions(num_devices, self.costs):
            if all(self.costs.costs(self.specs[m], pp, op).memory_per_device_gb > self.cluster.device_memory_gb
                   for m in models):
                continue  # no model of the bucket fits in such a group
            good, plans = self.fill(models, num_devices, size, pp, op)
            if good > best[0]:
                best = (good, plans)
            if good == total:
                break  # every request of the bucket meets its SLO: nothing left to beat
        return max(best[0], 0), best[1]

    def split_devices(self, bucketing: list[list[str]], evaluate) -> tuple[int, list[GroupPlan]]:
        """Give each bucket a multiple of `unit` devices so that the most requests meet their SLO.
        Buckets share nothing, so each (bucket, device count) is evaluated once: a knapsack."""
        n = self.cluster.num_devices
        unit = self.cfg.device_unit or self.cluster.devices_per_node
        unit = unit if n % unit == 0 and n >= unit * len(bucketing) else 1
        cache = {}
        table = {0: (0, [])}  # devices used by the buckets so far -> (good, plans)
        for bi, models in enumerate(bucketing):
            nxt = {}
            last = bi == len(bucketing) - 1
            for used, (good0, plans0) in table.items():
                for d in range(unit, n - used - (len(bucketing) - bi - 1) * unit + 1, unit):
                    if last and used + d != n:
                        continue
                    if (bi, d) not in cache:
                        cache[bi, d] = evaluate(models, d)
                    good, plans = cache[bi, d]
                    shifted = [GroupPlan([x + used for x in p.devices], p.pp, p.op, p.models) for p in plans]
                    if used + d not in nxt or good0 + good > nxt[used + d][0]:
                        nxt[used + d] = (good0 + good, plans0 + shifted)
            table = nxt
        return table.get(n, (-1, []))

    def alpaserve(self) -> list[GroupPlan]:
        cut = buckets(self.specs, self.cfg.bucket_ratio)
        options = [[list(self.specs)]] + ([cut] if len(cut) > 1 else [])
        return max((self.split_devices(b, self.best_partition) for b in options), key=lambda r: r[0])[1]

    def min_group_size(self, model: str) -> int:
        size = 1
        while self.costs.costs(self.specs[model], size, 1).memory_per_device_gb > self.cluster.device_memory_gb:
            size *= 2
        return size

    def selective_replication(self) -> list[GroupPlan]:
        """One device per replica; a model too big for one device gets the smallest pipeline it fits in."""
        by_size: dict[int, list[str]] = {}
        for m in self.specs:
            by_size.setdefault(self.min_group_size(m), []).append(m)

        def evaluate(models, d):
            size = min(self.min_group_size(m) for m in models)
            if d % size:
                return 0, [GroupPlan([x], 1, 1) for x in range(d)]
            return self.fill(models, d, size, size, 1)
        return self.split_devices([by_size[k] for k in sorted(by_size)], evaluate)[1]

    def round_robin(self) -> list[GroupPlan]:
        n = self.cluster.num_devices
        groups = [GroupPlan([d], 1, 1) for d in range(n)]
        used = [0.0] * n
        mem = {m: self.costs.costs(s, 1, 1).memory_per_device_gb for m, s in self.specs.items()}
        placed, d = True, 0
        while placed:  # cycle through the models, one replica at a time, while any fits somewhere
            placed = False
            for m in self.specs:
                for k in range(n):
                    g = (d + k) % n
                    if m not in groups[g].models and used[g] + mem[m] <= self.cluster.device_memory_gb + 1e-9:
                        groups[g].models.append(m)
                        used[g] += mem[m]
                        d, placed = (g + 1) % n, True
                        break
        return groups


def plan(policy: str, specs: dict[str, ModelSpec], cluster: Cluster, requests, slo: dict[str, float],
         costs=None, cfg: Optional[SearchConfig] = None) -> PlanResult:
    """requests: a Trace or a sorted list of Arrival; costs: AnalyticCostModel (default) or MeasuredCostModel."""
    t0 = time.perf_counter()
    costs = costs or AnalyticCostModel()
    cfg = cfg or SearchConfig()
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r} (supported: {', '.join(POLICIES)})")
    n = cluster.num_devices
    too_big = [m for m, spec in specs.items() if spec.memory_gb / n > cluster.device_memory_gb]
    if too_big:
        spec = specs[too_big[0]]
        raise ValueError(f"model {too_big[0]} ({spec.memory_gb:g} GB) does not fit even split over all {n} devices "
                         f"of {cluster.device_memory_gb:g} GB")
    trace = requests if isinstance(requests, Trace) else Trace.from_requests(requests, list(specs))
    planner = _Planner(specs, cluster, trace, slo, costs, cfg)
    groups = {"alpaserve": planner.alpaserve, "selective-replication": planner.selective_replication,
              "round-robin": planner.round_robin}[policy]()
    score = simulate(to_sim_groups(groups, specs, cluster, costs), trace, slo).slo_attainment
    return PlanResult(policy, groups, score, time.perf_counter() - t0, planner.simulations)
