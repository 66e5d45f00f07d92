"""`specserve profile` and `specserve plan replay`: the measured cost model, and real processes
serving placements of the embedded model checked against the simulator's prediction.

replay starts its processes itself (torch.multiprocessing), or runs under torchrun, one process per
rank, here or across machines:
  torchrun --nproc-per-node 3 -m specserve.cli.main plan replay --placements pipeline --workloads poisson:rate=2
"""
from __future__ import annotations

import json
import os
import time

import numpy as np

PLACEMENTS = {
    # two models ("a", "b": both the embedded model) on two devices (processes)
    "dedicated": [([0], ["a"]), ([1], ["b"])],
    "pipeline": [([0, 1], ["a", "b"])],
    "replicated": [([0], ["a", "b"]), ([1], ["a", "b"])],
}


def add_profile_args(p) -> None:
    p.add_argument("--model", default=None, help="GGUF file or HF directory (default: the embedded model)")
    p.add_argument("--tokens", type=int, default=16, help="prompt length of one request")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--out", default=None, help="default: bench/results/plan/profile-cpu.json "
                                                 "(--llm: bench/results/plan/llm-profile-cpu.json)")
    p.add_argument("--llm", action="store_true",
                   help="time whole passes over 1..1024 tokens instead (the LLM mode of `specserve plan --llm`)")


def cmd_profile(args):
    from ..planner.real.profile import profile_model

    if args.tokens < 1 or args.reps < 1:
        raise ValueError("--tokens and --reps must be >= 1")
    if args.llm:
        return _profile_llm(args)
    args.out = args.out or "bench/results/plan/profile-cpu.json"
    prof = profile_model(args.model, tokens=args.tokens, reps=args.reps)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    prof.save(args.out)
    names = prof.meta["units"]
    for name, t, b in zip(names, prof.layer_s, prof.layer_bytes):
        print(f"{name:>12}  {t * 1e3:7.2f} ms  {b / 1e6:6.1f} MB")
    print(f"one request ({prof.tokens} tokens): {prof.latency_s * 1e3:.1f} ms (whole pass {prof.meta['whole_pass_s'] * 1e3:.1f} ms); "
          f"stage boundary {prof.boundary_s * 1e3:.2f} ms")
    for pp in (2, 4):
        from ..planner.cost_model import MeasuredCostModel
        c = MeasuredCostModel(prof).costs(prof.spec(), pp, 1)
        print(f"pp={pp}: stages {[round(s * 1e3, 1) for s in c.stage_latency_s]} ms, {c.memory_per_device_gb * 1e3:.0f} MB per device")
    print(args.out)
    return 0


def add_replay_args(p) -> None:
    p.add_argument("--profile", default="bench/results/plan/profile-cpu.json",
                   help="from `specserve profile` (measured now when the file is missing)")
    p.add_argument("--placements", default="dedicated,pipeline", help=f"comma list of {', '.join(PLACEMENTS)}")
    p.add_argument("--workloads", default="poisson:rate=2;gamma:rate=8,cv=4",
                   help="';'-separated gamma:rate=R,cv=C | poisson:rate=R (total over the two models)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals per run")
    p.add_argument("--slo-scale", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench/results/plan")


def cmd_replay(args) -> int:
    from ..planner.cost_model import LayerProfile, MeasuredCostModel
    from ..planner.model_table import Cluster
    from ..planner.placement import GroupPlan, to_sim_groups
    from ..planner.simulator import Trace, simulate
    from ..planner.workload import parse_workload

    names = [n.strip() for n in args.placements.split(",") if n.strip()]
    bad = [n for n in names if n not in PLACEMENTS]
    if bad:
        raise ValueError(f"unknown placement {bad[0]!r} (known: {', '.join(PLACEMENTS)})")
    workloads = [w.strip() for w in args.workloads.split(";") if w.strip()]
    for w in workloads:
        if w.startswith("trace:"):
            raise ValueError("replay takes gamma:/poisson: workloads (two models a and b)")
        parse_workload(w, ["a", "b"], 1.0, 0)
    from ..planner.real.launch import torchrun_rank
    launched = torchrun_rank()
    if launched and (len(names) != 1 or len(workloads) != 1):
        raise ValueError("under torchrun, replay runs one placement and one workload (one process group)")
    if not os.path.exists(args.profile):
        if launched:
            raise ValueError(f"{args.profile}: no profile; run `specserve profile` before torchrun")
        from ..planner.real.profile import profile_model
        print(f"{args.profile}: not there, profiling the embedded model first")
        os.makedirs(os.path.dirname(args.profile) or ".", exist_ok=True)
        profile_model().save(args.profile)
    prof = LayerProfile.load(args.profile)
    from ..planner.real.runner import profiled_specs, run_placement

    specs = profiled_specs(prof, ["a", "b"])
    costs = MeasuredCostModel(prof)
    cluster = Cluster(1, 2, 1e9)  # CPU processes: memory is not the constraint here
    slo = {m: args.slo_scale * prof.latency_s for m in specs}
    rows = []
    for w in workloads:
        trace = Trace.from_requests(parse_workload(w, ["a", "b"], args.duration, args.seed), ["a", "b"])
        for name in names:
            plans = [GroupPlan(d, len(d), 1, list(m)) for d, m in PLACEMENTS[name]]
            sim = simulate(to_sim_groups(plans, specs, cluster, costs), trace, slo)
            t0 = time.perf_counter()
            real = run_placement(plans, trace, slo, prof, seed=args.seed)
            if real is None:
                return 0  # a stage process under torchrun: rank 0 reports
            row = {"workload": w, "placement": name, "requests": len(trace),
                   "sim_mean_latency_s": float(sim.latencies.mean()) if len(sim.latencies) else None,
                   "real_mean_latency_s": float(real.latencies.mean()) if len(real.latencies) else None,
                   "sim_p99_latency_s": sim.latency_percentile(99),
                   "real_p99_latency_s": float(np.percentile(real.latencies, 99)) if len(real.latencies) else None,
                   "sim_slo_attainment": sim.slo_attainment, "real_slo_attainment": real.slo_attainment,
                   "real_stage_compute_s": {str(d): float(np.median(v)) for d, v in real.stage_s.items() if len(v)},
                   "predicted_stage_s": costs.costs(prof.spec(), len(plans[0].devices), 1).stage_latency_s,
                   "real_dispatch_lag_s": float(np.nanmean(real.sent - real.arrival)) if len(real.sent) else None,
                   "wall_s": time.perf_counter() - t0}
            if row["sim_mean_latency_s"] and row["real_mean_latency_s"]:
                row["latency_error"] = row["sim_mean_latency_s"] / row["real_mean_latency_s"] - 1
            rows.append(row)
            print(_row_line(row), flush=True)
    ranks = {}
    for w in workloads:
        rs = [r for r in rows if r["workload"] == w]
        by = lambda key, rs=rs: [r["placement"] for r in sorted(rs, key=lambda r: -r[key])]
        ranks[w] = {"sim": by("sim_slo_attainment"), "real": by("real_slo_attainment")}
        ranks[w]["same"] = ranks[w]["sim"] == ranks[w]["real"]
        print(f"{w}: attainment order simulated {ranks[w]['sim']}, measured {ranks[w]['real']}: "
              f"{'same' if ranks[w]['same'] else 'DIFFERENT'}")
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, f"replay-{time.strftime('%Y%m%d-%H%M%S')}")
    result = {"profile": args.profile, "profile_latency_s": prof.latency_s, "slo_scale": args.slo_scale,
              "duration_s": args.duration, "seed": args.seed, "rows": rows, "ranking": ranks}
    with open(base + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(f"# specserve plan replay: real 2-process placements vs the simulator\n\nprofile {args.profile} "
                f"(one request {prof.latency_s * 1e3:.1f} ms), SLO {args.slo_scale:g}x, {args.duration:g} s per run\n\n"
                "| workload | placement | requests | mean latency sim / real (ms) | error | p99 sim / real (ms) "
                "| attainment sim / real |\n|---|---|---|---|---|---|---|\n")
        for r in rows:
            f.write(f"| {r['workload']} | {r['placement']} | {r['requests']} | {_ms(r['sim_mean_latency_s'])} / "
                    f"{_ms(r['real_mean_latency_s'])} | {_pct(r.get('latency_error'))} | {_ms(r['sim_p99_latency_s'])} / "
                    f"{_ms(r['real_p99_latency_s'])} | {r['sim_slo_attainment']:.3f} / {r['real_slo_attainment']:.3f} |\n")
        for w, rk in ranks.items():
            f.write(f"\n{w}: simulated order {rk['sim']}, measured {rk['real']} ({'same' if rk['same'] else 'different'})")
        f.write("\n")
    _plot(rows, workloads, base + ".png")
    print(f"{base}.json, {base}.md, {base}.png")
    return 0


def _ms(x):
    return "-" if x is None else f"{x * 1e3:.0f}"


def _pct(x):
    return "-" if x is None else f"{100 * x:+.0f}%"


def _row_line(r) -> str:
    return (f"{r['workload']:>24} {r['placement']:>10}: mean latency sim {_ms(r['sim_mean_latency_s'])} ms / real "
            f"{_ms(r['real_mean_latency_s'])} ms ({_pct(r.get('latency_error'))}), attainment sim "
            f"{r['sim_slo_attainment']:.3f} / real {r['real_slo_attainment']:.3f}  [{r['requests']} requests, "
            f"{r['wall_s']:.0f} s]")


def _plot(rows, workloads, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axs = plt.subplots(1, 2, figsize=(10, 3.8))
    labels = [f"{r['placement']}\n{r['workload']}" for r in rows]
    x = np.arange(len(rows))
    for ax, key, unit, scale in ((axs[0], "mean_latency_s", "mean latency (ms)", 1e3),
                                 (axs[1], "slo_attainment", "SLO attainment (%)", 100)):
        ax.bar(x - 0.2, [scale * (r["sim_" + key] or 0) for r in rows], 0.4, label="simulated")
        ax.bar(x + 0.2, [scale * (r["real_" + key] or 0) for r in rows], 0.4, label="measured (real processes)")
        ax.set_xticks(x, labels, fontsize=7)
        ax.set_ylabel(unit)
        ax.grid(axis="y", alpha=0.3)
    axs[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _profile_llm(args) -> int:
    from specserve_bench.passes import profile_passes

    out = args.out or "bench/results/plan/llm-profile-cpu.json"
    prof = profile_passes(args.model, reps=min(args.reps, 3))
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    prof.save(out)
    for n, t in zip(prof.tokens, prof.seconds):
        print(f"{n:6d} tokens  {t * 1e3:9.2f} ms")
    print(f"weights {prof.weights_gb * 1e3:.1f} MB, KV {prof.kv_gb_per_token * 1e9 / 1024:.1f} KiB per token; "
          f"draft: {prof.meta.get('draft', 'none')}")
    print(out)
    return 0
