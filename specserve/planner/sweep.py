"""AlpaServe-style sweeps: SLO attainment vs rate, CV, SLO scale and cluster size, per policy.

Each point plans afresh for its own workload (as AlpaServe does) and reports the simulated
attainment of that plan. From the rate and CV axes it reads off the largest rate and the largest
CV at which each policy still serves >= 99% of requests within SLO (linear interpolation between
grid points), and AlpaServe's factor over selective replication: the paper's "up to 10x higher
rates or 6x more burstiness".
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Optional

from tqdm import tqdm

from .cost_model import AnalyticCostModel, CostParams
from .model_table import ARTIFACT_MEMORY_BUDGET_GB, Cluster, parse_cluster, parse_models
from .search import SearchConfig, plan
from .simulator import Trace
from .workload import multi_model

TARGET = 0.99


@dataclass(frozen=True)
class SweepPoint:
    rate: float  # requests/s over all models
    cv: float
    slo_scale: float
    num_devices: int


@dataclass
class SweepConfig:
    models: str = "S1"
    cluster: str = "8x8:16GB"
    rate: float = 0.0  # base point; 0: the set's default (DEFAULT_RATES)
    cv: float = 2.0
    slo_scale: float = 5.0
    skew: float = 0.0  # power-law exponent of per-model rates (0: even)
    memory_budget_gb: Optional[float] = ARTIFACT_MEMORY_BUDGET_GB  # None: the whole device
    request_overhead_s: float = 0.0
    requests: int = 8000  # per point: the duration is chosen to give about this many
    seed: int = 0
    rate_factors: tuple = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)
    cvs: tuple = (1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0)
    slo_scales: tuple = (1.5, 2.0, 3.0, 5.0, 7.5, 10.0)
    device_counts: tuple = (16, 32, 48, 64)
    policies: tuple = ("alpaserve", "selective-replication", "round-robin")
    search: SearchConfig = field(default_factory=SearchConfig)


# Base rates (requests/s) where selective replication is near its 99% limit at CV 2 on 64 V100s
DEFAULT_RATES = {"S1": 160.0, "S2": 32.0, "S3": 32.0, "S3-FIT": 48.0, "S4": 1.0}


def _points(cfg: SweepConfig, cluster: Cluster) -> dict[str, list[SweepPoint]]:
    base = SweepPoint(cfg.rate or DEFAULT_RATES.get(cfg.models.upper(), 10.0), cfg.cv, cfg.slo_scale,
                      cluster.num_devices)
    return {
        "rate": [replace(base, rate=base.rate * f) for f in cfg.rate_factors],
        "cv": [replace(base, cv=c) for c in cfg.cvs],
        "slo_scale": [replace(base, slo_scale=s) for s in cfg.slo_scales],
        "num_devices": [replace(base, num_devices=d) for d in cfg.device_counts],
    }


def run_point(cfg: SweepConfig, cluster: Cluster, point: SweepPoint, policy: str) -> dict:
    specs = dict(parse_models(cfg.models))
    per_node = cluster.devices_per_node
    if point.num_devices > per_node and point.num_devices % per_node:
        raise ValueError(f"{point.num_devices} devices is not a whole number of {per_node}-device nodes")
    sub = Cluster(max(1, point.num_devices // per_node), min(per_node, point.num_devices), cluster.device_memory_gb,
                  cfg.memory_budget_gb)
    duration = cfg.requests / point.rate
    trace = Trace.from_requests(multi_model(list(specs), point.rate, point.cv, duration, cfg.seed, skew=cfg.skew),
                                list(specs))
    slo = {m: point.slo_scale * s.latency_s for m, s in specs.items()}
    t0 = time.perf_counter()
    costs = AnalyticCostModel(CostParams(request_overhead_s=cfg.request_overhead_s))
    result = plan(policy, specs, sub, trace, slo, costs=costs, cfg=cfg.search)
    return {**asdict(point), "policy": policy, "slo_attainment": result.slo_attainment,
            "planning_time_s": time.perf_counter() - t0, "num_requests": len(trace),
            "configs": sorted({f"{len(g.devices)}x(pp{g.pp},op{g.op})" for g in result.groups if g.models})}


def threshold(xs: list[float], ys: list[float], target: float = TARGET) -> tuple[float | None, bool]:
    """Largest x with y >= target before y first drops below it (linear interpolation);
    (None, False) when even the first point misses; (last x, True) when no point misses (a lower bound)."""
    if not ys or ys[0] < target:
        return None, False
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if y1 < target:
            return x0 + (x1 - x0) * (y0 - target) / (y0 - y1), False
    return xs[-1], True


def summarise(rows: list[dict], policies: tuple) -> dict:
    out = {}
    for axis in ("rate", "cv"):
        per_policy = {}
        for pol in policies:
            pts = sorted((r[axis], r["slo_attainment"]) for r in rows if r["axis"] == axis and r["policy"] == pol)
            x, lower_bound = threshold([p[0] for p in pts], [p[1] for p in pts])
            per_policy[pol] = {"max_at_99": x, "lower_bound": lower_bound}
        a, s = per_policy.get("alpaserve", {}).get("max_at_99"), per_policy.get("selective-replication", {}).get("max_at_99")
        factor = a / s if a is not None and s else None
        out[axis] = {"policies": per_policy, "factor_alpaserve_over_sr": factor,
                     "factor_is_lower_bound": bool(factor and per_policy["alpaserve"]["lower_bound"])}
    return out


def sweep(cfg: SweepConfig, axes=("rate", "cv", "slo_scale", "num_devices")) -> dict:
    cluster = parse_cluster(cfg.cluster)
    parse_models(cfg.models)  # fail early on a bad set
    jobs = [(axis, p, pol) for axis, pts in _points(cfg, cluster).items() if axis in axes
            for p in pts for pol in cfg.policies]
    rows, t0 = [], time.perf_counter()
    for axis, point, pol in tqdm(jobs, desc=f"plan sweep {cfg.models}", unit="plan"):
        rows.append({"axis": axis, **run_point(cfg, cluster, point, pol)})
    return {"config": {**asdict(cfg), "search": asdict(cfg.search)}, "rows": rows,
            "summary": summarise(rows, cfg.policies), "wall_time_s": time.perf_counter() - t0}


def plot(result: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, cfg = result["rows"], result["config"]
    labels = {"rate": "rate (requests/s)", "cv": "CV of inter-arrival times", "slo_scale": "SLO scale",
              "num_devices": "devices"}
    axes_present = [a for a in labels if any(r["axis"] == a for r in rows)]
    fig, axs = plt.subplots(1, len(axes_present), figsize=(4.2 * len(axes_present), 3.6), squeeze=False)
    for ax, axis in zip(axs[0], axes_present):
        for pol in cfg["policies"]:
            pts = sorted((r[axis], r["slo_attainment"]) for r in rows if r["axis"] == axis and r["policy"] == pol)
            ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], marker="o", label=pol)
        ax.axhline(100 * TARGET, color="gray", lw=0.8, ls="--")
        ax.set_xlabel(labels[axis])
        ax.set_ylabel("SLO attainment (%)")
        ax.grid(alpha=0.3)
    axs[0][0].legend(fontsize=8)
    base_rate = next((r["rate"] for r in rows if r["axis"] != "rate"), None)
    fig.suptitle(f"{cfg['models']} on {cfg['cluster']} (other axes at rate {base_rate:g}/s, CV {cfg['cv']:g}, "
                 f"SLO scale {cfg['slo_scale']:g})" if base_rate else f"{cfg['models']} on {cfg['cluster']}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def two_model_example(cvs=(1, 2, 3, 4, 5, 6, 7, 8), rate: float = 2.0, slo_scale: float = 20.0,
                      requests: int = 10000, seeds: int = 4) -> dict:
    """AlpaServe's motivating example: two 13.4 GB models (BERT-6.7B) on two 16 GB devices.
    Dedicated: one model per device. Model-parallel: both models on both devices as a 2-stage
    pipeline (6.7 GB of each per device). Equal rates; attainment averaged over `seeds` traces."""
    from .model_table import MODEL_TABLE
    from .placement import GroupPlan, to_sim_groups
    from .simulator import simulate

    spec = MODEL_TABLE["bert-6.7b"]
    specs, cluster = {"a": spec, "b": spec}, parse_cluster("1x2:16GB")
    placements = {"dedicated": [GroupPlan([0], 1, 1, ["a"]), GroupPlan([1], 1, 1, ["b"])],
                  "model-parallel": [GroupPlan([0, 1], 2, 1, ["a", "b"])]}
    groups = {name: to_sim_groups(p, specs, cluster) for name, p in placements.items()}
    slo = {m: slo_scale * spec.latency_s for m in specs}
    rows = []
    for cv in cvs:
        att = {name: 0.0 for name in groups}
        for seed in range(seeds):
            trace = Trace.from_requests(multi_model(["a", "b"], rate, cv, requests / rate, seed), ["a", "b"])
            for name, g in groups.items():
                att[name] += simulate(g, trace, slo).slo_attainment / seeds
        rows.append({"cv": cv, **att, "gap": att["model-parallel"] - att["dedicated"]})
    return {"config": {"model": "bert-6.7b", "cluster": "1x2:16GB", "rate": rate, "slo_scale": slo_scale,
                       "requests_per_trace": requests, "seeds": seeds, "arrivals": "Poisson at CV 1, Gamma above"},
            "placements": {n: [{"devices": g.devices, "pp": g.pp, "op": g.op, "models": g.models} for g in p]
                           for n, p in placements.items()},
            "rows": rows}


def plot_example(result: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, cfg = result["rows"], result["config"]
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for name in ("dedicated", "model-parallel"):
        ax.plot([r["cv"] for r in rows], [100 * r[name] for r in rows], marker="o", label=name)
    ax.set_xlabel("CV of inter-arrival times (1 = Poisson)")
    ax.set_ylabel("SLO attainment (%)")
    ax.set_title(f"2 x BERT-6.7B on 2 x 16 GB, {cfg['rate']:g} req/s, SLO {cfg['slo_scale']:g}x", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
