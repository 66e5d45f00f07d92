"""Per-stage latency and per-device memory of a model under a parallel configuration.

A configuration splits a model into `pp` pipeline stages, each sharded `op` ways (intra-operator
parallelism); the group uses pp * op devices. The analytic model (for models that cannot run here):

  stage latency = (L / pp) / op * (1 + intra_overhead * (op - 1))  +  boundary_s  (if pp > 1)
  memory/device = W / (pp * op)

with L the single-device latency and W the weight memory. `intra_overhead` stands for the
all-reduces of sharded layers (each extra shard adds that fraction of the shard's compute), and
`boundary_s` for sending activations to the next stage. The measured source (profiling the real
model's layers on this machine) fills the same StageCosts from timings instead.
"""
from __future__ import annotations

from dataclasses import dataclass

from .models import ModelSpec


@dataclass(frozen=True)
class CostParams:
    intra_overhead: float = 0.1  # fraction of shard compute added per extra intra-op shard
    boundary_s: float = 0.002  # activation transfer between pipeline stages, seconds


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
    stage = compute + (params.boundary_s if pp > 1 else 0.0)
    return StageCosts([stage] * pp, model.memory_gb / (pp * op))
