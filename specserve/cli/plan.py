"""`specserve plan`: place models on a cluster for SLO attainment (AlpaServe) and print the placement.

  specserve plan [--cluster 8x8:16GB --models S2 --workload gamma:rate=20,cv=4 ...]
  specserve plan sweep --models S1,S2,S3-fit     attainment vs rate / CV / SLO scale / devices, PNG + JSON
  specserve plan example                         the two-model example (dedicated vs model-parallel)
  specserve plan replay --profile p.json         a real 2-process pipeline vs the simulator
  specserve plan --llm                           LLM mode: does a draft beside its target beat another replica?
"""
from __future__ import annotations

import json
import os
import time

from ..planner.cost_model import AnalyticCostModel, CostParams, LayerProfile, MeasuredCostModel
from ..planner.model_table import ARTIFACT_MEMORY_BUDGET_GB, parse_cluster, parse_models
from ..planner.placement import to_sim_groups
from ..planner.search import POLICIES, SearchConfig, plan
from ..planner.simulator import simulate
from ..planner.workload import parse_workload
from .args import positive_float, positive_int


def _search_args(p) -> None:
    d = SearchConfig()
    p.add_argument("--beam", type=positive_int, default=d.beam, help="partial placements kept per greedy step")
    p.add_argument("--model-candidates", type=int, default=d.model_candidates,
                   help="models tried per greedy step, most SLO misses first (0: all)")
    p.add_argument("--group-candidates", type=int, default=d.group_candidates,
                   help="groups tried per model, least loaded first (0: all)")
    p.add_argument("--bucket-threshold", type=float, default=d.bucket_threshold,
                   help="relative latency difference within which models share a bucket (AlpaServe: 0.38)")
    p.add_argument("--max-pp", type=positive_int, default=d.max_pp, help="most pipeline stages in a group")
    p.add_argument("--max-op", type=positive_int, default=d.max_op, help="most intra-op shards (within a node)")
    p.add_argument("--no-fill", dest="fill", action="store_false",
                   help="stop a greedy fill at the first replica that does not raise the score "
                        "(default: fill memory and keep the best placement seen)")
    p.add_argument("--memory-budget", type=positive_float, default=ARTIFACT_MEMORY_BUDGET_GB,
                   help="GB per device for weights (default %(default)g, AlpaServe's artifact on 16 GB V100s; "
                        "capped at the device's memory)")
    p.add_argument("--request-overhead", type=float, default=CostParams().request_overhead_s,
                   help="fixed seconds per request added to the first stage (the table's latencies hold it: 0)")


def _search_config(args) -> SearchConfig:
    return SearchConfig(beam=args.beam, model_candidates=args.model_candidates,
                        group_candidates=args.group_candidates, bucket_threshold=args.bucket_threshold,
                        max_pp=args.max_pp, max_op=args.max_op, fill=args.fill)


def _cost_params(args) -> CostParams:
    return CostParams(request_overhead_s=args.request_overhead)


def add_plan_args(p) -> None:
    p.add_argument("--cluster", default="8x8:16GB", help="NODESxDEVICES:MEMORY (default 8x8:16GB)")
    p.add_argument("--models", default="S2", help="S1-S4, S3-fit, or NAME:COUNT[,NAME:COUNT...]")
    p.add_argument("--workload", default="gamma:rate=20,cv=4",
                   help="gamma:rate=R,cv=C | poisson:rate=R | trace:PATH (CSV)")
    p.add_argument("--duration", type=positive_float, default=600.0, help="seconds of arrivals to simulate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--slo-scale", type=positive_float, default=5.0, help="SLO = scale x the model's single-device latency")
    p.add_argument("--policy", default="alpaserve", choices=list(POLICIES))
    p.add_argument("--profile", default=None, help="measured cost model from `specserve profile` (else analytic)")
    p.add_argument("--json", default=None, help="write the placement and its metrics here")
    _search_args(p)
    from .plan_llm import add_llm_args
    add_llm_args(p)
    sub = p.add_subparsers(dest="plan_command", parser_class=type(p))

    s = sub.add_parser("sweep", help="SLO attainment vs rate, CV, SLO scale and devices for every policy")
    s.add_argument("--models", default="S1,S2,S3-fit", help="comma list of model sets")
    s.add_argument("--cluster", default="8x8:16GB")
    s.add_argument("--axes", default="rate,cv,slo_scale,num_devices")
    s.add_argument("--cv", type=positive_float, default=2.0, help="CV of the base point")
    s.add_argument("--slo-scale", type=positive_float, default=5.0, help="SLO scale of the base point")
    s.add_argument("--skew", type=float, default=0.0, help="power-law exponent of the per-model rates (0: even)")
    s.add_argument("--requests", type=positive_int, default=8000, help="requests per simulated point")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", default="bench/results/plan")
    _search_args(s)

    e = sub.add_parser("example", help="2 x 13.4 GB models on 2 x 16 GB devices: dedicated vs model-parallel by CV")
    e.add_argument("--rate", type=float, default=2.0)
    e.add_argument("--slo-scale", type=float, default=20.0)
    e.add_argument("--out", default="bench/results/plan")

    from .replay import add_replay_args
    add_replay_args(sub.add_parser("replay", help="run placements of the embedded model on real processes "
                                                  "(torch.distributed) and compare with the simulator"))


def cmd_plan(args) -> int:
    if args.plan_command == "sweep":
        return cmd_sweep(args)
    if args.plan_command == "example":
        return cmd_example(args)
    if args.plan_command == "replay":
        from .replay import cmd_replay
        return cmd_replay(args)
    if args.llm:
        from .plan_llm import cmd_plan_llm
        return cmd_plan_llm(args)
    cluster = parse_cluster(args.cluster).with_budget(args.memory_budget)
    costs, extra = AnalyticCostModel(_cost_params(args)), {}
    if args.profile:  # the profiled model joins the table under its name, e.g. --models embedded:4
        profile = LayerProfile.load(args.profile)
        costs = MeasuredCostModel(profile, fallback=costs, request_overhead_s=args.request_overhead)
        extra = {profile.model: profile.spec()}
    instances = parse_models(args.models, extra)
    specs = dict(instances)
    need = sum(s.memory_gb for s in specs.values())
    if need > cluster.num_devices * cluster.budget_gb:
        print(f"note: the models need {need:.4g} GB, the cluster has {cluster.num_devices * cluster.budget_gb:.4g} "
              f"GB for weights: some cannot be placed and their requests fail")
    requests = parse_workload(args.workload, list(specs), args.duration, args.seed)
    slo = {m: args.slo_scale * s.latency_s for m, s in specs.items()}
    result = plan(args.policy, specs, cluster, requests, slo, costs, _search_config(args))
    sim = simulate(to_sim_groups(result.groups, specs, cluster, costs), requests, slo)
    util = sim.utilisation()
    out = {
        "policy": result.policy, "cluster": args.cluster, "memory_budget_gb": cluster.budget_gb,
        "models": args.models, "workload": args.workload,
        "slo_scale": args.slo_scale, "num_requests": len(requests),
        "groups": [{"devices": g.devices, "pp": g.pp, "op": g.op, "models": g.models} for g in result.groups],
        "slo_attainment": sim.slo_attainment, "latency_p50_s": sim.latency_percentile(50),
        "latency_p99_s": sim.latency_percentile(99), "goodput_rps": sim.goodput,
        "mean_device_utilisation": sum(util.values()) / len(util) if util else 0.0,
        "planning_time_s": result.planning_time_s, "simulations": result.simulations,
    }
    for g in out["groups"]:
        print(f"devices {g['devices'][0]}-{g['devices'][-1]} pp={g['pp']} op={g['op']}: {', '.join(g['models']) or '-'}")
    p50 = "-" if out["latency_p50_s"] is None else f"{out['latency_p50_s']:.3f}"
    p99 = "-" if out["latency_p99_s"] is None else f"{out['latency_p99_s']:.3f}"
    print(f"{result.policy}: SLO attainment {sim.slo_attainment:.4f} over {len(requests)} requests, "
          f"latency p50 {p50} s, p99 {p99} s, planned in {result.planning_time_s:.2f} s "
          f"({result.simulations} simulations)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


def cmd_sweep(args) -> int:
    from ..planner.sweep import SweepConfig, plot, sweep

    sets = [s.strip() for s in args.models.split(",") if s.strip()]
    axes = [a.strip() for a in args.axes.split(",")]
    bad = [a for a in axes if a not in ("rate", "cv", "slo_scale", "num_devices")]
    if bad:
        raise ValueError(f"unknown axes {bad} (supported: rate, cv, slo_scale, num_devices)")
    for s in sets:
        parse_models(s)
    os.makedirs(args.out, exist_ok=True)
    stamp, t0, lines = time.strftime("%Y%m%d-%H%M%S"), time.perf_counter(), []
    for s in sets:
        cfg = SweepConfig(models=s, cluster=args.cluster, cv=args.cv, slo_scale=args.slo_scale, skew=args.skew,
                          memory_budget_gb=args.memory_budget, request_overhead_s=args.request_overhead,
                          requests=args.requests, seed=args.seed, search=_search_config(args))
        result = sweep(cfg, axes)
        base = os.path.join(args.out, f"sweep-{s.lower()}-{stamp}")
        with open(base + ".json", "w") as f:
            json.dump(result, f, indent=1)
        plot(result, base + ".png")
        lines += _summary_lines(s, result)
        print(f"{s}: {base}.json, {base}.png ({result['wall_time_s']:.0f} s)")
    total = time.perf_counter() - t0
    md = os.path.join(args.out, f"sweep-{stamp}.md")
    with open(md, "w") as f:
        f.write(f"# specserve plan sweep ({args.cluster}, {args.memory_budget:g} GB for weights, base CV {args.cv:g}, "
                f"SLO scale {args.slo_scale:g}, skew {args.skew:g}; "
                f"{total:.0f} s in all)\n\n| set | axis | AlpaServe max at 99% | SR max at 99% | RR max at 99% "
                f"| AlpaServe / SR | AlpaServe planning s (mean / max) | paper |\n|---|---|---|---|---|---|---|---|\n"
                + "\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"summary: {md} (whole sweep {total:.0f} s)")
    return 0


def _summary_lines(name: str, result: dict) -> list[str]:
    def fmt(p):
        if p is None or p["max_at_99"] is None:
            return "never"
        return (">= " if p["lower_bound"] else "") + f"{p['max_at_99']:.3g}"

    out = []
    for axis, paper in (("rate", "up to 10x"), ("cv", "up to 6x")):
        s = result["summary"].get(axis)
        if s is None or not any(r["axis"] == axis for r in result["rows"]):
            continue
        pol = s["policies"]
        f = s["factor_alpaserve_over_sr"]
        factor = "-" if f is None else (">= " if s["factor_is_lower_bound"] else "") + f"{f:.2f}x"
        times = [r["planning_time_s"] for r in result["rows"] if r["axis"] == axis and r["policy"] == "alpaserve"]
        plan_s = f"{sum(times) / len(times):.1f} / {max(times):.1f}" if times else "-"
        out.append(f"| {name} | {axis} | {fmt(pol.get('alpaserve'))} | {fmt(pol.get('selective-replication'))} | "
                   f"{fmt(pol.get('round-robin'))} | {factor} | {plan_s} | {paper} |")
    return out


def cmd_example(args) -> int:
    from ..planner.sweep import plot_example, two_model_example

    result = two_model_example(rate=args.rate, slo_scale=args.slo_scale)
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, "two-models")
    with open(base + ".json", "w") as f:
        json.dump(result, f, indent=1)
    plot_example(result, base + ".png")
    print("  CV  dedicated  model-parallel  gap")
    for r in result["rows"]:
        print(f"{r['cv']:4g}  {r['dedicated']:9.4f}  {r['model-parallel']:14.4f}  {r['gap']:+.4f}")
    print(f"{base}.json, {base}.png")
    return 0
