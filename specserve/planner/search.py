"""Placement policies: round-robin, selective replication, and AlpaServe's search.

AlpaServe (section 4.2, Algorithms 1 and 2), with the semantics of the authors' artifact
(`alpa-projects/mms`, placement_policy/):
- buckets: models join the first bucket whose first model's latency is within 38% of theirs
  (`bucket_threshold`); each bucket gets its own devices, searched alone, and the device split
  that scores best wins; the unbucketed search (all models on all devices) competes with it;
- group layouts: groups of one power-of-two size (inside a node, or whole nodes), each pp x op
  with pp <= 8 and op <= 4 (shards stay within a node), and the devices left over as pipelines of
  powers of two (the artifact's `enumerate_group_configs_uneven`);
- each layout is filled greedily, one replica a step, the replica that scores best in simulation,
  until no replica fits in memory; the best placement seen on the way is kept (a later step may
  lose attainment, and a full placement is not always the best);
- scores compare requests within SLO, then lower mean latency, then more replicas (the artifact's
  `goodput - latency_mean / 1e4 + replicas / 1e6`, as a lexicographic order).

Scoring every (model, group) pair at every step is thousands of simulations per replica with 70
models on 64 devices. Two prunings keep a full sweep within minutes: each step tries the
`model_candidates` models with the most requests missing their SLO (then, when none is missing,
those with the most requests per replica), and for each the `group_candidates` least-loaded groups
it fits in, one per set of interchangeable groups (same configuration, same models). 0: all.

Selective replication is the same fill with every device its own group (a model too big for one
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
    bucket_threshold: float = 0.38  # relative latency difference within which models share a bucket
    device_unit: int = 0  # bucket device counts are multiples of this (0: devices per node)
    max_pp: int = 8
    max_op: int = 4
    fill: bool = True  # keep adding replicas until memory is full (False: stop when a step does not improve)

    def __post_init__(self):
        for name, lowest in (("beam", 1), ("model_candidates", 0), ("group_candidates", 0), ("device_unit", 0),
                             ("max_pp", 1), ("max_op", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lowest:
                raise ValueError(f"{name.replace('_', '-')} must be an integer >= {lowest}, got {v!r}")
        if not (isinstance(self.bucket_threshold, (int, float)) and 0 < self.bucket_threshold < float("inf")):
            raise ValueError(f"bucket-threshold must be a finite number > 0, got {self.bucket_threshold!r}")


@dataclass(frozen=True)
class Score:
    """What a placement achieves on the planning trace; additive over buckets (they share nothing)."""

    good: int = 0  # requests within SLO
    latency_sum: float = 0.0  # seconds, over those requests
    replicas: int = 0

    def key(self) -> tuple:
        """Order: more requests within SLO, then lower mean latency, then more replicas."""
        mean = self.latency_sum / self.good if self.good else 0.0
        return (self.good, -mean, self.replicas)

    def __add__(self, other: "Score") -> "Score":
        return Score(self.good + other.good, self.latency_sum + other.latency_sum, self.replicas + other.replicas)


@dataclass
class PlanResult:
    policy: str
    groups: list[GroupPlan]
    slo_attainment: float
    planning_time_s: float
    simulations: int = 0  # event-loop passes the search ran


class _Bucket:
    """Some models on groups of given parallel configurations, in the arrays the event loop reads."""

    def __init__(self, models: list[str], specs: dict[str, ModelSpec], trace: Trace, slo: dict[str, float],
                 costs, configs: list[tuple[int, int]], capacity_gb: float):
        self.models, self.trace, self.configs = models, trace.subset(models), configs
        self.slo = np.asarray([slo[m] for m in models], dtype=np.float64)
        per_cfg = {cfg: [costs.costs(specs[m], *cfg) for m in models] for cfg in set(configs)}
        num_stages = max(len(c.stage_latency_s) for cs in per_cfg.values() for c in cs)
        G, M = len(configs), len(models)
        self.lat = np.zeros((G, M, num_stages))  # [G, M, P] seconds per stage
        self.mem = np.zeros((G, M))  # [G, M] GB per device
        self.num_stages = np.zeros(G, dtype=np.int64)
        for g, cfg in enumerate(configs):
            for i, c in enumerate(per_cfg[cfg]):
                self.lat[g, i, :len(c.stage_latency_s)] = c.stage_latency_s
                self.mem[g, i] = c.memory_per_device_gb
            self.num_stages[g] = max(len(c.stage_latency_s) for c in per_cfg[cfg])
        self.capacity = capacity_gb + 1e-9
        self.requests = np.bincount(self.trace.model, minlength=M)  # [M]
        self.work = self.requests * self.lat.max(axis=2)  # [G, M] bottleneck-stage seconds group g spends on m
        self.simulations = 0

    def score(self, served: np.ndarray) -> tuple[Score, np.ndarray]:
        """The placement's score and its requests within SLO per model [M]."""
        finish = np.empty(len(self.trace))
        busy = np.zeros((served.shape[0], self.lat.shape[2]))
        total = run_trace(self.trace.arrival, self.trace.model, self.slo, served, self.lat, self.num_stages,
                          -1, -1, self.lat[0, 0], finish, busy)
        self.simulations += 1
        ok = ~np.isnan(finish)
        lat = float((finish[ok] - self.trace.arrival[ok]).sum())
        return Score(int(total), lat, int(served.sum())), np.bincount(self.trace.model[ok], minlength=len(self.models))

    def fits(self, served: np.ndarray) -> np.ndarray:
        """[G, M] bool: model m is not on group g and fits beside what g holds."""
        used = (served * self.mem).sum(axis=1)  # [G]
        return ~served & (used[:, None] + self.mem <= self.capacity)

    def candidates(self, served: np.ndarray, per_model_good: np.ndarray, cfg: SearchConfig) -> list[tuple[int, int]]:
        """(group, model) additions worth simulating from this placement."""
        missing = self.requests - per_model_good
        order = [int(m) for m in np.argsort(-missing, kind="stable") if missing[m] > 0]
        if cfg.fill:  # then the rest, busiest per replica first
            per_replica = self.requests / (served.sum(axis=0) + 1)
            order += [int(m) for m in np.argsort(-per_replica, kind="stable") if missing[m] <= 0]
        fits = self.fits(served)
        load = (served * self.work).sum(axis=1)  # [G]
        out = []
        for m in order:
            where = np.flatnonzero(fits[:, m])
            seen, groups = set(), []
            for g in where[np.argsort(load[where], kind="stable")]:
                key = (self.configs[g], served[g].tobytes())  # same configuration and models: interchangeable
                if key not in seen:
                    seen.add(key)
                    groups.append(int(g))
            groups = groups[:cfg.group_candidates or None]
            if groups:
                out += [(g, m) for g in groups]
                if cfg.model_candidates and len({mm for _, mm in out}) >= cfg.model_candidates:
                    break
        return out

    def greedy(self, served: np.ndarray, cfg: SearchConfig) -> tuple[np.ndarray, Score]:
        best_score, per_model = self.score(served)
        best, frontier = served, [(served, per_model)]
        while frontier:
            scored = []
            for state, per_model in frontier:
                cands = self.candidates(state, per_model, cfg)
                if not cands:
                    continue
                g_idx = np.asarray([g for g, _ in cands], dtype=np.int64)
                m_idx = np.asarray([m for _, m in cands], dtype=np.int64)
                goods, lat_sums = score_additions(self.trace.arrival, self.trace.model, self.slo, state, self.lat,
                                                  self.num_stages, g_idx, m_idx, self.lat[g_idx, m_idx])
                self.simulations += len(cands)
                replicas = int(state.sum()) + 1
                scored += [(Score(int(v), float(s), replicas), state, g, m)
                           for v, s, g, m in zip(goods, lat_sums, g_idx, m_idx)]
            scored.sort(key=lambda c: c[0].key(), reverse=True)
            top = scored[:cfg.beam]
            if not top or (not cfg.fill and top[0][0].key() <= best_score.key()):
                break
            frontier = []
            for _, state, g, m in top:
                new = state.copy()
                new[g, m] = True
                frontier.append((new, self.score(new)[1]))
            if top[0][0].key() > best_score.key():
                best_score, best = top[0][0], frontier[0][0]
        return best, best_score


def layouts(num_devices: int, devices_per_node: int, costs=None, max_pp: int = 8,
            max_op: int = 4) -> list[list[tuple[int, int]]]:
    """Ways to cut the devices into groups, each a list of (pp, op) per group: groups of one
    power-of-two size (at most a node, or whole nodes) with every pp x op within the caps, and the
    devices left over as pipelines of powers of two (13 = 4 + 4 + 4 + 1)."""
    def ok(pp, op):
        return costs is None or costs.supports(pp, op)

    out, size = [], 1
    while size <= num_devices:
        if size <= devices_per_node or size % devices_per_node == 0:
            rest = num_devices % size
            remainder = [1 << b for b in reversed(range(rest.bit_length())) if rest >> b & 1]
            if all(ok(r, 1) for r in remainder):
                for pp in (p for p in range(1, size + 1) if size % p == 0):
                    op = size // pp
                    if pp <= max_pp and op <= max_op and ok(pp, op):
                        out.append([(pp, op)] * (num_devices // size) + [(r, 1) for r in remainder])
        size *= 2
    return out


def buckets(specs: dict[str, ModelSpec], threshold: float = 0.38) -> list[list[str]]:
    """Models in order, each joining the first bucket whose first model's latency is within
    `threshold` of its own (relative to that first model's), else starting a new bucket."""
    out: list[list[str]] = []
    for m in specs:
        lat = specs[m].latency_s
        for b in out:
            first = specs[b[0]].latency_s
            if abs(lat - first) / first < threshold:
                b.append(m)
                break
        else:
            out.append([m])
    return out


class _Planner:
    def __init__(self, specs, cluster: Cluster, trace: Trace, slo, costs, cfg: SearchConfig):
        self.specs, self.cluster, self.trace, self.slo, self.costs, self.cfg = specs, cluster, trace, slo, costs, cfg
        self.simulations = 0

    def fill(self, models: list[str], configs: list[tuple[int, int]]) -> tuple[Score, list[GroupPlan]]:
        """Greedy fill of groups with these (pp, op), laid out on devices 0.. in order."""
        b = _Bucket(models, self.specs, self.trace, self.slo, self.costs, configs, self.cluster.budget_gb)
        served, score = b.greedy(np.zeros((len(configs), len(models)), dtype=np.bool_), self.cfg)
        self.simulations += b.simulations
        plans, first = [], 0
        for g, (pp, op) in enumerate(configs):
            plans.append(GroupPlan(list(range(first, first + pp * op)), pp, op,
                                   [models[m] for m in np.flatnonzero(served[g])]))
            first += pp * op
        return score, plans

    def best_layout(self, models: list[str], num_devices: int) -> tuple[Score, list[GroupPlan]]:
        best = (Score(-1), [GroupPlan([d], 1, 1) for d in range(num_devices)])  # nothing fits: devices stay empty
        per_node = min(self.cluster.devices_per_node, num_devices)
        for configs in layouts(num_devices, per_node, self.costs, self.cfg.max_pp, self.cfg.max_op):
            if all(self.costs.costs(self.specs[m], pp, op).memory_per_device_gb > self.cluster.budget_gb
                   for m in models for pp, op in set(configs)):
                continue  # no model of the bucket fits in any group of this layout
            score, plans = self.fill(models, configs)
            if score.key() > best[0].key():
                best = (score, plans)
        return (best[0] if best[0].good >= 0 else Score()), best[1]

    def split_devices(self, bucketing: list[list[str]], evaluate) -> tuple[Score, list[GroupPlan]]:
        """Give each bucket a multiple of `unit` devices so that the placement scores best.
        Buckets share nothing, so each (bucket, device count) is evaluated once: a knapsack."""
        n = self.cluster.num_devices
        unit = self.cfg.device_unit or self.cluster.devices_per_node
        unit = unit if n % unit == 0 and n >= unit * len(bucketing) else 1
        cache = {}
        table = {0: (Score(), [])}  # devices used by the buckets so far -> (score, plans)
        for bi, models in enumerate(bucketing):
            nxt = {}
            last = bi == len(bucketing) - 1
            for used, (score0, plans0) in table.items():
                for d in range(unit, n - used - (len(bucketing) - bi - 1) * unit + 1, unit):
                    if last and used + d != n:
                        continue
                    if (bi, d) not in cache:
                        cache[bi, d] = evaluate(models, d)
                    score, plans = cache[bi, d]
                    shifted = [GroupPlan([x + used for x in p.devices], p.pp, p.op, p.models) for p in plans]
                    total = score0 + score
                    if used + d not in nxt or total.key() > nxt[used + d][0].key():
                        nxt[used + d] = (total, plans0 + shifted)
            table = nxt
        return table.get(n, (Score(-1), []))

    def alpaserve(self) -> list[GroupPlan]:
        cut = buckets(self.specs, self.cfg.bucket_threshold)
        options = [[list(self.specs)]] + ([cut] if len(cut) > 1 else [])
        return max((self.split_devices(b, self.best_layout) for b in options), key=lambda r: r[0].key())[1]

    def min_group_size(self, model: str) -> int:
        size = 1
        while self.costs.costs(self.specs[model], size, 1).memory_per_device_gb > self.cluster.budget_gb:
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
                return Score(), [GroupPlan([x], 1, 1) for x in range(d)]
            return self.fill(models, [(size, 1)] * (d // size))
        return self.split_devices([by_size[k] for k in sorted(by_size)], evaluate)[1]

    def round_robin(self) -> list[GroupPlan]:
        """Replicas dealt out in turn while memory lasts. Groups are single devices, or, when some model
        fits no single device, pipelines of the size the biggest model needs (the artifact's
        round-robin baseline uses uniform pipelines too)."""
        size = max(self.min_group_size(m) for m in self.specs)
        n = self.cluster.num_devices // size
        groups = [GroupPlan(list(range(g * size, (g + 1) * size)), size, 1) for g in range(n)]
        groups += [GroupPlan([d], 1, 1) for d in range(n * size, self.cluster.num_devices)]  # left over: idle
        used = [0.0] * n
        mem = {m: self.costs.costs(s, size, 1).memory_per_device_gb for m, s in self.specs.items()}
        placed, d = True, 0
        while placed:  # cycle through the models, one replica at a time, while any fits somewhere
            placed = False
            for m in self.specs:
                for k in range(n):
                    g = (d + k) % n
                    if m not in groups[g].models and used[g] + mem[m] <= self.cluster.budget_gb + 1e-9:
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
    too_big = [m for m, spec in specs.items() if spec.memory_gb / n > cluster.budget_gb]
    if too_big:
        spec = specs[too_big[0]]
        raise ValueError(f"model {too_big[0]} ({spec.memory_gb:g} GB) does not fit even split over all {n} devices "
                         f"with {cluster.budget_gb:g} GB each for weights (--memory-budget)")
    trace = requests if isinstance(requests, Trace) else Trace.from_requests(requests, list(specs))
    planner = _Planner(specs, cluster, trace, slo, costs, cfg)
    groups = {"alpaserve": planner.alpaserve, "selective-replication": planner.selective_replication,
              "round-robin": planner.round_robin}[policy]()
    score = simulate(to_sim_groups(groups, specs, cluster, costs), trace, slo).slo_attainment
    return PlanResult(policy, groups, score, time.perf_counter() - t0, planner.simulations)
