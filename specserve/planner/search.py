"""Placement policies: round-robin, selective replication, and AlpaServe's search.

AlpaServe (section 4.2): enumerate ways to cut the devices into equal groups with a parallel
configuration (power-of-two group sizes, every pp x op factorisation), fill each candidate greedily
(repeatedly add the model replica that most raises simulated SLO attainment, memory permitting; a
beam keeps the best few partial placements), and keep the best. Selective replication is the same
greedy fill with every device its own group; round-robin ignores the workload.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from .cost_model import CostParams
from .models import Cluster, ModelSpec
from .placement import GroupPlan, memory_used_gb, to_sim_groups
from .simulator import Request, simulate


@dataclass
class PlanResult:
    policy: str
    groups: list[GroupPlan]
    slo_attainment: float
    planning_time_s: float


def _score(plans, specs, cluster, requests, slo, params) -> float:
    return simulate(to_sim_groups(plans, specs, cluster, params), requests, slo).slo_attainment


def _fits(plan: GroupPlan, model: str, specs, cluster: Cluster, params) -> bool:
    trial = GroupPlan(plan.devices, plan.pp, plan.op, plan.models + [model])
    return memory_used_gb(trial, specs, params) <= cluster.device_memory_gb + 1e-9


def greedy_fill(plans: list[GroupPlan], specs: dict[str, ModelSpec], cluster: Cluster, requests: list[Request],
                slo: dict[str, float], params: CostParams = CostParams(), beam: int = 1) -> tuple[list[GroupPlan], float]:
    """Add replicas one at a time, each the one that most raises attainment, until none helps."""
    best_score = _score(plans, specs, cluster, requests, slo, params)
    best, frontier = plans, [plans]
    while frontier:
        candidates = []
        for state in frontier:
            tried = set()  # groups alike in config and models are interchangeable: try one of them
            for gi, g in enumerate(state):
                for m in specs:
                    key = (g.pp, g.op, tuple(g.models), m)
                    if m in g.models or key in tried or not _fits(g, m, specs, cluster, params):
                        continue
                    tried.add(key)
                    new = [GroupPlan(p.devices, p.pp, p.op, p.models + ([m] if i == gi else []))
                           for i, p in enumerate(state)]
                    candidates.append((_score(new, specs, cluster, requests, slo, params), new))
        candidates.sort(key=lambda c: -c[0])
        top = candidates[:beam]
        if not top or top[0][0] <= best_score + 1e-12:
            break
        best_score, best = top[0]
        frontier = [state for _, state in top]
    return best, best_score


def partitions(cluster: Cluster) -> list[tuple[int, int, int]]:
    """(group size, pp, op) with power-of-two group sizes dividing the cluster."""
    out, size = [], 1
    while size <= cluster.num_devices:
        if cluster.num_devices % size == 0:
            out += [(size, pp, size // pp) for pp in range(1, size + 1) if size % pp == 0]
        size *= 2
    return out


def plan(policy: str, specs: dict[str, ModelSpec], cluster: Cluster, requests: list[Request], slo: dict[str, float],
         params: CostParams = CostParams(), beam: int = 1) -> PlanResult:
    t0 = time.perf_counter()
    n = cluster.num_devices
    too_big = [m for m, spec in specs.items() if spec.memory_gb / n > cluster.device_memory_gb]
    if too_big:
        spec = specs[too_big[0]]
        raise ValueError(f"model {too_big[0]} ({spec.memory_gb:g} GB) does not fit even split over all {n} devices "
                         f"of {cluster.device_memory_gb:g} GB")
    if policy == "round-robin":
        groups = [GroupPlan([d], 1, 1) for d in range(n)]
        placed, d = True, 0
        while placed:  # cycle through the models, one replica at a time, while any fits somewhere
            placed = False
            for m in specs:
                for k in range(n):
                    g = groups[(d + k) % n]
                    if m not in g.models and _fits(g, m, specs, cluster, params):
                        g.models.append(m)
                        d, placed = (d + k + 1) % n, True
                        break
        score = _score(groups, specs, cluster, requests, slo, params)
    elif policy == "selective-replication":
        groups, score = greedy_fill([GroupPlan([d], 1, 1) for d in range(n)], specs, cluster, requests, slo, params, beam)
    elif policy == "alpaserve":
        groups, score = None, -1.0
        for size, pp, op in partitions(cluster):
            empty = [GroupPlan(list(range(i, i + size)), pp, op) for i in range(0, n, size)]
            g, s = greedy_fill(empty, specs, cluster, requests, slo, params, beam)
            if s > score:
                groups, score = g, s
    else:
        raise ValueError(f"unknown policy {policy!r} (supported: alpaserve, selective-replication, round-robin)")
    return PlanResult(policy, groups, score, time.perf_counter() - t0)
