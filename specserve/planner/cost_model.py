"""Per-stage latency and per-device memory of a model under a parallel configuration.

A configuration splits a model into `pp` pipeline stages, each sharded `op` ways (intra-operator
parallelism); the group uses pp * op devices. Two sources fill the same StageCosts:

Analytic (models that cannot run here, e.g. the AlpaServe table's V100 latencies):

  stage latency = (L / pp) / op * (1 + intra_overhead * (op - 1))  +  boundary_s  (every stage but the last)
  memory/device = W / (pp * op)

with L the single-device latency and W the weight memory. `intra_overhead` stands for the
all-reduces of sharded layers (each extra shard adds that fraction of the shard's compute), and
`boundary_s` for sending activations to the next stage: pp - 1 boundaries, as the measured model
counts them. The search keeps op <= 4 so shards stay inside a node (SearchConfig.max_op).

Both models add `request_overhead_s` to the first stage: the fixed cost of dispatching a request
(AlpaServe's artifact measures ~11-14 ms on its GPUs). It defaults to 0 because the model table's
latencies are end-to-end numbers from the paper, which hold it already; `--request-overhead` sets it
(e.g. with a measured profile, which times the layers only).

Measured (`specserve profile`): the real model's layers timed on this machine; a pp split cuts the
layers into contiguous stages with the slowest stage as fast as possible, and each stage boundary
adds the measured time to send the activations between processes. Intra-op sharding is not
measured (one CPU process per stage), so only op = 1 configurations are offered.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from .model_table import ModelSpec


@dataclass(frozen=True)
class CostParams:
    intra_overhead: float = 0.1  # fraction of shard compute added per extra intra-op shard
    boundary_s: float = 0.002  # activation transfer between pipeline stages, seconds
    request_overhead_s: float = 0.0  # fixed per-request cost, added to the first stage

    def __post_init__(self):
        for name in ("intra_overhead", "boundary_s", "request_overhead_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0 <= v < float("inf")):
                raise ValueError(f"{name.replace('_', '-')} must be a finite number >= 0, got {v!r}")


@dataclass(frozen=True)
class StageCosts:
    stage_latency_s: list[float]  # one entry per pipeline stage
    memory_per_device_gb: float

    @property
    def latency_s(self) -> float:
        return sum(self.stage_latency_s)


def analytic_costs(model: ModelSpec, pp: int, op: int, params: CostParams = CostParams()) -> StageCosts:
    if pp < 1 or op < 1:
        raise ValueError(f"pp and op must be >= 1, got pp={pp}, op={op}")
    compute = model.latency_s / pp / op * (1 + params.intra_overhead * (op - 1))
    stages = [compute + params.boundary_s] * (pp - 1) + [compute]
    stages[0] += params.request_overhead_s
    return StageCosts(stages, model.memory_gb / (pp * op))


class AnalyticCostModel:
    def __init__(self, params: CostParams = CostParams()):
        self.params = params

    def supports(self, pp: int, op: int) -> bool:
        return True

    def costs(self, model: ModelSpec, pp: int, op: int) -> StageCosts:
        return analytic_costs(model, pp, op, self.params)


@dataclass
class LayerProfile:
    """What `specserve profile` measured for one model: seconds and bytes per layer, in order."""

    model: str
    layer_s: list[float]  # embedding, blocks..., final norm + head
    layer_bytes: list[int]
    boundary_s: float  # send + receive one stage's activations between two processes
    tokens: int  # prompt length of the profiled request
    device: str = "cpu"
    meta: dict = field(default_factory=dict)

    @property
    def latency_s(self) -> float:
        return sum(self.layer_s)

    def spec(self, name: str | None = None) -> ModelSpec:
        return ModelSpec(name or self.model, sum(self.layer_bytes) / 1e9, self.latency_s)

    def split(self, pp: int) -> list[tuple[int, int]]:
        """Contiguous layer ranges [start, end) for pp stages minimising the slowest stage."""
        n = len(self.layer_s)
        if not 1 <= pp <= n:
            raise ValueError(f"cannot split {n} profiled layers into {pp} stages")
        prefix = [0.0]
        for t in self.layer_s:
            prefix.append(prefix[-1] + t)
        # best[k][j]: min over splits of layers[:j] into k stages of the slowest stage (n is tiny: plain DP)
        inf = float("inf")
        best = [[inf] * (n + 1) for _ in range(pp + 1)]
        cut = [[0] * (n + 1) for _ in range(pp + 1)]
        best[0][0] = 0.0
        for k in range(1, pp + 1):
            for j in range(k, n + 1):
                for i in range(k - 1, j):
                    v = max(best[k - 1][i], prefix[j] - prefix[i])
                    if v < best[k][j]:
                        best[k][j], cut[k][j] = v, i
        bounds, j = [], n
        for k in range(pp, 0, -1):
            bounds.append((cut[k][j], j))
            j = cut[k][j]
        return bounds[::-1]

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.__dict__, f, indent=2)

    @classmethod
    def load(cls, path: str) -> "LayerProfile":
        try:
            with open(path) as f:
                data = json.load(f)
            return cls(**data)
        except OSError as e:
            raise ValueError(f"{path}: cannot read profile ({e.strerror})") from None
        except (json.JSONDecodeError, TypeError) as e:
            raise ValueError(f"{path}: not a specserve profile ({e})") from None


class MeasuredCostModel:
    """Stage latencies from a LayerProfile; models named like the profile use it, others fall back."""

    def __init__(self, profile: LayerProfile, fallback: AnalyticCostModel | None = None,
                 request_overhead_s: float = 0.0):
        self.profile = profile
        self.fallback = fallback
        self.request_overhead_s = request_overhead_s

    def supports(self, pp: int, op: int) -> bool:
        return op == 1 and pp <= len(self.profile.layer_s)

    def costs(self, model: ModelSpec, pp: int, op: int) -> StageCosts:
        if model.name != self.profile.model:
            if self.fallback is None:
                raise ValueError(f"no profile for model {model.name!r} (profiled: {self.profile.model})")
            return self.fallback.costs(model, pp, op)
        if op != 1:
            raise ValueError("the measured cost model has no intra-op sharding (op must be 1)")
        bounds = self.profile.split(pp)
        # each stage but the last also sends its activations on
        stages = [sum(self.profile.layer_s[a:b]) + (self.profile.boundary_s if k < pp - 1 else 0.0)
                  for k, (a, b) in enumerate(bounds)]
        stages[0] += self.request_overhead_s
        mem = max(sum(self.profile.layer_bytes[a:b]) for a, b in bounds) / 1e9
        return StageCosts(stages, mem)
