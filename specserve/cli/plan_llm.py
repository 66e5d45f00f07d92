"""`specserve plan --llm`: speculation-aware placement of LLMs, on worked examples.

For each scenario it plans twice on the same generations, without drafts and with them, and shows
whether a draft beside its target beat another replica of the target, step by step.
"""
from __future__ import annotations

import glob
import json
import os
import time
from typing import Optional

from ..planner.llm import LLMSLO, DraftSpec, PassProfile, llm_workload, load_llm_trace
from ..planner.llm_search import SCENARIOS, plan_llm

DEFAULT_PROFILE = "bench/results/plan/llm-profile-cpu.json"
SPEC_BENCH_GLOB = "bench/results/spec-cpu-*.json"  # `specserve bench spec` results, dated in their names


def newest_spec_bench(pattern: str = SPEC_BENCH_GLOB, model_file: Optional[str] = None, setting: str = "greedy") -> str:
    """The newest `specserve bench spec` result (the names sort by date) of model_file (a basename; any
    model when None) that holds the `setting` table, for --spec-bench's default."""
    for path in sorted(glob.glob(pattern), reverse=True):
        try:
            with open(path) as f:
                r = json.load(f)
        except (OSError, json.JSONDecodeError):
            continue
        if setting in r.get("tables", {}) and (model_file is None or r.get("model") == model_file):
            return path
    raise FileNotFoundError(f"no `specserve bench spec` result of {model_file or 'any model'} with a {setting} table "
                            f"matches {pattern}: run it, or pass --spec-bench")


def add_llm_args(p) -> None:
    p.add_argument("--llm", action="store_true", help="LLM mode: generations, TTFT/TPOT SLOs, KV memory, "
                                                      "speculation-aware placement (worked examples)")
    p.add_argument("--llm-profile", default=DEFAULT_PROFILE, help="from `specserve profile --llm`")
    p.add_argument("--spec-bench", default=None,
                   help=f"a `specserve bench spec` result: the draft's alpha and c (default: the newest {SPEC_BENCH_GLOB})")
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma list of {', '.join(SCENARIOS)}")
    p.add_argument("--llm-trace", default=None,
                   help="the Azure LLM inference trace's CSV (TIMESTAMP, ContextTokens, GeneratedTokens) in place "
                        "of the scenarios' generated arrivals and lengths")
    p.add_argument("--out", default="bench/results/plan", help="where the LLM mode writes JSON and markdown")


def write_placement(path: str, scenario: str, result: dict, model: str) -> None:
    """The first scenario's speculation-aware placement as `specserve serve --placement` reads it
    (cluster/placement.py): a replica per model a device holds, the EAGLE draft ("draft") on those that carry it;
    beside it what the simulator expects of it."""
    from ..cluster.placement import ServePlacement
    plan = result["speculation-aware"]
    devices = [(d["models"], d["drafts"]) for d in plan["devices"]]
    names = sorted({m for ms, _ in devices for m in ms})
    placement = ServePlacement.from_devices(devices, {m: {"model": None if model == "embedded" else model}
                                                      for m in names}, {"speculative": "draft"})
    simulated = {k: v for k, v in plan.items() if k not in ("devices", "steps", "spec_by_batch")}
    with open(path, "w") as f:
        json.dump({**placement.to_dict(), "scenario": scenario, "simulated": simulated}, f, indent=1, default=str)
    print(f"placement of {scenario} (speculation-aware, {len(placement.replicas)} replicas): {path} "
          f"(serve it: specserve serve --placement {path})")


def _ms(x):
    return "-" if x is None else f"{x * 1e3:.0f}"


def cmd_plan_llm(args) -> int:
    names = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    bad = [s for s in names if s not in SCENARIOS]
    if bad:
        raise ValueError(f"unknown scenarios {bad} (known: {', '.join(SCENARIOS)})")
    if not os.path.exists(args.llm_profile):
        raise ValueError(f"{args.llm_profile}: no pass profile; make one with `specserve profile --llm`")
    base = PassProfile.load(args.llm_profile)
    if "draft" not in base.meta:
        raise ValueError(f"{args.llm_profile}: the profile names no draft (profile the embedded model)")
    dmeta = base.meta["draft"]
    if not args.spec_bench:
        from ..loading import embedded_model_path
        args.spec_bench = newest_spec_bench(model_file=os.path.basename(embedded_model_path()) if base.model == "embedded"
                                            else os.path.basename(base.model))
    draft = DraftSpec.from_spec_bench(args.spec_bench, dmeta["weights_gb"], dmeta["kv_gb_per_token"])
    print(f"target: {base.weights_gb * 1e3:.0f} MB weights, {base.kv_gb_per_token * 1e6:.1f} KB KV per token, "
          f"one step at batch 1 {base.pass_s(1) * 1e3:.1f} ms; draft: {draft.weights_gb * 1e3:.1f} MB, "
          f"alpha {draft.alpha:.3f}, c {draft.c:.3f} ({args.spec_bench})")
    # prompts in the engine's chunks when the profile measured them (a prefill curve and its chunk)
    chunk = base.meta.get("prefill_chunk") if base.chunked else None
    report, lines = {"profile": args.llm_profile, "spec_bench": args.spec_bench, "draft": draft.__dict__,
                     "prefill_chunk": chunk, "scenarios": {}}, []
    for name in names:
        sc = SCENARIOS[name]
        models = [f"m{i}" for i in range(sc.models)]
        profiles = {m: base for m in models}
        drafts = {m: draft for m in models}
        slo = {m: LLMSLO(sc.ttft_scale * base.pass_s(sc.prompt_median), sc.tpot_scale * base.pass_s(1)) for m in models}
        if args.llm_trace:
            gens = load_llm_trace(args.llm_trace, models)
        else:
            gens = llm_workload(models, sc.rate, sc.cv, sc.duration, sc.seed, prompt_median=sc.prompt_median,
                                output_median=sc.output_median)
        runs = {}
        for label, allow in (("no drafts", False), ("speculation-aware", True)):
            plan = plan_llm(models, sc.devices, gens, profiles, drafts, slo, sc.budget_gb, allow_drafts=allow,
                            prefill_chunk=chunk)
            runs[label] = plan
        s0, s1 = runs["no drafts"], runs["speculation-aware"]
        gain = s1.result.slo_attainment - s0.result.slo_attainment
        report["scenarios"][name] = {
            "scenario": sc.__dict__, "generations": len(gens),
            "slo_ms": {"ttft": slo[models[0]].ttft_s * 1e3, "tpot": slo[models[0]].tpot_s * 1e3},
            **{label: {"devices": [d.__dict__ for d in p.devices], **p.result.summary(),
                       "spec_by_batch": {b: p.result.spec_by_batch.get(b, 0) / n for b, n in sorted(p.result.batch_hist.items())},
                       "steps": p.steps, "planning_time_s": p.planning_time_s, "simulations": p.simulations}
               for label, p in runs.items()},
            "attainment_gain": gain}
        print(f"\n== {name}: {sc.why}")
        print(f"   {len(gens)} generations at {sc.rate:g}/s over {sc.models} models on {sc.devices} devices of "
              f"{sc.budget_gb:g} GB; SLO TTFT {_ms(slo[models[0]].ttft_s)} ms, TPOT {_ms(slo[models[0]].tpot_s)} ms")
        for label, p in runs.items():
            summ = p.result.summary()
            place = "; ".join(f"dev{d}: " + ", ".join(m + ("+draft" if m in dev.drafts else "") for m in dev.models)
                              for d, dev in enumerate(p.devices))
            print(f"   {label:>18}: attainment {summ['slo_attainment']:.3f}  TTFT p50 {_ms(summ['ttft_p50_s'])} ms  "
                  f"TPOT p50 {_ms(summ['tpot_p50_s'])} ms  mean batch {summ['mean_decode_batch']:.1f}  "
                  f"steps speculating {summ['spec_share']:.0%}  [{place}]  ({p.planning_time_s:.1f} s)")
        for i, st in enumerate(s1.steps):
            br, bd = st.get("best_replica"), st.get("best_draft")
            alt = "  vs  ".join(f"{x['what']} {x['attainment']:.3f}" for x in (bd, br) if x)
            print(f"   step {i + 1}: {alt}  -> {st['chose']}")
        verdict = "raises" if gain > 0.005 else "does not raise"
        print(f"   speculation-aware placement {verdict} attainment: {s0.result.slo_attainment:.3f} -> "
              f"{s1.result.slo_attainment:.3f}")
        aware = s1.result.summary()
        lines.append(f"| {name} | {len(gens)} | {_ms(slo[models[0]].tpot_s)} | {s0.result.slo_attainment:.3f} | "
                     f"{aware['slo_attainment']:.3f} | {aware['spec_share']:.0%} | "
                     f"{aware['mean_decode_batch']:.1f} | {sc.why} |")
    if args.json:
        write_placement(args.json, names[0], report["scenarios"][names[0]], base.model)
    os.makedirs(args.out, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = os.path.join(args.out, f"llm-{stamp}")
    with open(path + ".json", "w") as f:
        json.dump(report, f, indent=1, default=str)
    with open(path + ".md", "w") as f:
        f.write(f"# specserve plan --llm ({args.llm_profile}, draft alpha {draft.alpha:.3f}, c {draft.c:.3f})\n\n"
                "| scenario | generations | TPOT SLO ms | attainment, no drafts | speculation-aware | steps speculating "
                "| mean decode batch | why |\n|---|---|---|---|---|---|---|---|\n" + "\n".join(lines) + "\n")
    print(f"\n{path}.json, {path}.md")
    return 0
