"""`specserve plan`: place models on a cluster for SLO attainment and print the placement."""
from __future__ import annotations

import json

from ..planner.models import parse_cluster, parse_models
from ..planner.search import plan
from ..planner.simulator import simulate
from ..planner.placement import to_sim_groups
from ..planner.workload import load_trace, multi_model


def add_plan_args(p) -> None:
    p.add_argument("--cluster", default="8x8:16GB", help="NODESxDEVICES:MEMORY (default 8x8:16GB)")
    p.add_argument("--models", default="S2", help="S1-S4 or NAME:COUNT[,NAME:COUNT...]")
    p.add_argument("--workload", default="gamma:rate=20,cv=4",
                   help="gamma:rate=R,cv=C | poisson:rate=R | trace:PATH (CSV)")
    p.add_argument("--duration", type=float, default=600.0, help="seconds of arrivals to simulate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slo-scale", type=float, default=5.0, help="SLO = scale x the model's single-device latency")
    p.add_argument("--policy", default="alpaserve", choices=["alpaserve", "selective-replication", "round-robin"])
    p.add_argument("--beam", type=int, default=1)
    p.add_argument("--json", default=None, help="write the placement and its metrics here")


def parse_workload(spec: str, models: list[str], duration: float, seed: int):
    kind, _, rest = spec.partition(":")
    if kind == "trace":
        return load_trace(rest, models, seed=seed)
    try:
        kv = {k.strip(): float(v) for k, v in (item.split("=") for item in rest.split(",") if item.strip())}
    except ValueError:
        raise ValueError(f"workload {spec!r}: expected KIND:key=value,... e.g. gamma:rate=20,cv=4") from None
    if kind == "gamma" and "rate" in kv:
        return multi_model(models, kv["rate"], kv.get("cv", 1.0), duration, seed)
    if kind == "poisson" and "rate" in kv:
        return multi_model(models, kv["rate"], 1.0, duration, seed)
    raise ValueError(f"workload {spec!r}: expected gamma:rate=R,cv=C, poisson:rate=R or trace:PATH")


def cmd_plan(args) -> int:
    cluster = parse_cluster(args.cluster)
    instances = parse_models(args.models)
    specs = dict(instances)
    requests = parse_workload(args.workload, list(specs), args.duration, args.seed)
    slo = {m: args.slo_scale * s.latency_s for m, s in specs.items()}
    result = plan(args.policy, specs, cluster, requests, slo, beam=args.beam)
    sim = simulate(to_sim_groups(result.groups, specs, cluster), requests, slo)
    out = {
        "policy": result.policy, "cluster": args.cluster, "models": args.models, "workload": args.workload,
        "slo_scale": args.slo_scale, "num_requests": len(requests),
        "groups": [{"devices": g.devices, "pp": g.pp, "op": g.op, "models": g.models} for g in result.groups],
        "slo_attainment": sim.slo_attainment, "latency_p50_s": sim.latency_percentile(50),
        "latency_p99_s": sim.latency_percentile(99), "goodput_rps": sim.goodput,
        "planning_time_s": result.planning_time_s,
    }
    for g in out["groups"]:
        print(f"devices {g['devices'][0]}-{g['devices'][-1]} pp={g['pp']} op={g['op']}: {', '.join(g['models']) or '-'}")
    p50 = "-" if out["latency_p50_s"] is None else f"{out['latency_p50_s']:.3f}"
    p99 = "-" if out["latency_p99_s"] is None else f"{out['latency_p99_s']:.3f}"
    print(f"{result.policy}: SLO attainment {sim.slo_attainment:.3f} over {len(requests)} requests, "
          f"latency p50 {p50} s, p99 {p99} s, planned in {result.planning_time_s:.2f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0
