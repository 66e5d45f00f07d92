"""A placement: device groups, each with a parallel configuration and the models it serves.
Turns into simulator groups, checking that every device holds its share of every model."""
from __future__ import annotations

from dataclasses import dataclass, field

from .cost_model import AnalyticCostModel
from .model_table import Cluster, ModelSpec
from .simulator import Group


@dataclass
class GroupPlan:
    devices: list[int]
    pp: int
    op: int
    models: list[str] = field(default_factory=list)  # instance names

    def __post_init__(self):
        if self.pp * self.op != len(self.devices):
            raise ValueError(f"group of {len(self.devices)} devices cannot run pp={self.pp} x op={self.op}")


def memory_used_gb(plan: GroupPlan, specs: dict[str, ModelSpec], costs=None) -> float:
    costs = costs or AnalyticCostModel()
    return sum(costs.costs(specs[m], plan.pp, plan.op).memory_per_device_gb for m in plan.models)


def to_sim_groups(plans: list[GroupPlan], specs: dict[str, ModelSpec], cluster: Cluster, costs=None) -> list[Group]:
    """costs: an AnalyticCostModel (default) or MeasuredCostModel."""
    costs = costs or AnalyticCostModel()
    seen: set[int] = set()
    groups = []
    for plan in plans:
        bad = [d for d in plan.devices if d in seen or not 0 <= d < cluster.num_devices]
        if bad:
            raise ValueError(f"devices {bad} are used twice or are not in the {cluster.num_devices}-device cluster")
        seen.update(plan.devices)
        used = memory_used_gb(plan, specs, costs)
        if used > cluster.budget_gb + 1e-9:
            raise ValueError(f"placement does not fit: group {plan.devices} (pp={plan.pp}, op={plan.op}) needs "
                             f"{used:.1f} GB per device for {len(plan.models)} models; devices have "
                             f"{cluster.budget_gb:g} GB for weights")
        groups.append(Group(list(plan.devices),
                            {m: costs.costs(specs[m], plan.pp, plan.op).stage_latency_s for m in plan.models},
                            pp=plan.pp, op=plan.op))
    return groups
