"""A plain-Python reference for the numba event loop: the tests' executable spec.

Written from AlpaServe's semantics (OSDI 2023, section 4), not from `simulator.run_trace`, and short
on purpose. Events sit in one heap: a stage finishing a request, and a request arriving. At equal
times completions come first, so a request that finishes at t is not outstanding for an arrival at t.

- Routing: an arriving request goes to the group serving its model with the fewest requests
  admitted and not yet finished; ties go to the lower group index.
- Each stage of a group serves one request at a time from its own FIFO queue; a request that
  leaves stage s joins stage s+1's queue at once (pipelining).
- Admission: the controller knows every latency, so it knows when a request would finish. It finds
  out here by copying the group and running that copy forward with the request added (no formula
  shared with the numba loop); a request that would miss arrival + SLO is dropped on arrival and
  costs no device time.

O(queue length) per arrival: fine for the tests' thousands of requests, far too slow for the search.
"""
from __future__ import annotations

import copy
import heapq
import math
from collections import deque
from typing import Sequence

from .simulator import Group, Trace

_SLACK = 1e-12  # the numba loop's float slack on the deadline


class _GroupState:
    def __init__(self, group: Group):
        self.latency = {m: list(s) for m, s in group.stage_latency.items()}
        self.num_stages = max(len(s) for s in self.latency.values())
        self.queue = [deque() for _ in range(self.num_stages)]  # waiting (request, model) per stage
        self.busy: list = [None] * self.num_stages  # (request, model, end) in service per stage
        self.outstanding: set[int] = set()

    def lat(self, model: str, stage: int) -> float:
        stages = self.latency[model]
        return stages[stage] if stage < len(stages) else 0.0

    def start_idle(self, now: float, events: list, gi: int) -> None:
        """Every idle stage with a waiting request starts it."""
        for s in range(self.num_stages):
            if self.busy[s] is None and self.queue[s]:
                r, m = self.queue[s].popleft()
                end = now + self.lat(m, s)
                self.busy[s] = (r, m, end)
                heapq.heappush(events, (end, 0, gi, s, r))

    def complete(self, stage: int, now: float, events: list, gi: int, finish: dict) -> None:
        r, m, _ = self.busy[stage]
        self.busy[stage] = None
        if stage + 1 < self.num_stages:
            self.queue[stage + 1].append((r, m))
        else:
            finish[r] = now
            self.outstanding.discard(r)
        self.start_idle(now, events, gi)

    def finish_if_admitted(self, r: int, m: str, now: float) -> float:
        """Run a copy of this group forward with request r added; when does r finish?"""
        twin = copy.deepcopy(self)
        events = [(end, 0, 0, s, rr) for s, b in enumerate(twin.busy) if b is not None for rr, _, end in [b]]
        heapq.heapify(events)
        twin.queue[0].append((r, m))
        twin.start_idle(now, events, 0)
        done: dict[int, float] = {}
        while r not in done:
            t, _, _, s, _ = heapq.heappop(events)
            twin.complete(s, t, events, 0, done)
        return done[r]


def simulate_reference(groups: Sequence[Group], trace: Trace, slo: dict[str, float]) -> list[float]:
    """Finish time of every request of `trace` (NaN: dropped or unserved), in trace order."""
    states = [_GroupState(g) for g in groups]
    events = [(float(t), 1, -1, -1, i) for i, t in enumerate(trace.arrival)]  # kind 0 (completion) < 1 (arrival)
    heapq.heapify(events)
    finish: dict[int, float] = {}
    result = [math.nan] * len(trace)
    while events:
        t, kind, gi, stage, r = heapq.heappop(events)
        if kind == 0:
            states[gi].complete(stage, t, events, gi, finish)
            continue
        m = trace.models[trace.model[r]]
        serving = [i for i, g in enumerate(states) if m in g.latency]
        if not serving:
            continue
        gi = min(serving, key=lambda i: (len(states[i].outstanding), i))
        g = states[gi]
        if g.finish_if_admitted(r, m, t) - t > slo.get(m, math.inf) + _SLACK:
            continue
        g.outstanding.add(r)
        g.queue[0].append((r, m))
        g.start_idle(t, events, gi)
    for r, f in finish.items():
        result[r] = f
    return result
