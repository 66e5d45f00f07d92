"""A plan replayed on real replicas (issue 38, Deliver 2): the LLM planner's simulated SLO attainment
against the attainment measured through the OpenAI endpoint, on the same workload trace, for three
placements of two models on two devices, at a low and a high load. AlpaServe closes this loop for its
one-shot models (`specserve plan replay`); this is the same check for LLM generations.

    python bench/placement_replay.py [--calibrate] [--rates 0.4,0.8] [--skew 2] [--duration 150]
                                     [--placements dedicated,replicated,draft]

A planner device is one core here: each replica is a Ray actor pinned to its device's core with one
engine thread, and the simulator reads a pass profile measured with one thread (made on first use,
kept in bench/results/plan/llm-profile-cpu-1t.json: decode steps timed at the trace's median prompt
length of context, whole prompts' prefills in the engine's chunks, and the chunk, which the replicas
are then given so that the simulator prices the steps they run). `--calibrate` measures what serving
adds to those passes (a step's and a streamed token's cost, and two replicas switching on one core:
`calibrate`) into the profile, and the simulator adds it from then on. The two models are the
embedded model twice (the planner sees two models with their own arrivals: `--skew` gives the first
the larger share, as AlpaServe's power law does); "draft" carries the EAGLE draft beside each.
Each request is streamed (ignore_eos, its trace's prompt and output lengths); TTFT is the first
token's arrival, TPOT the time after it over the remaining tokens, as the simulator defines them.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import time

import numpy as np

from specserve.planner.llm import LLMSLO, DraftSpec, Generation, LLMDevice, PassProfile, llm_workload, simulate_llm
from specserve.planner.llm_search import plan_llm
from specserve_bench.replicas import cpu_s, replay, serving

PLACEMENTS = {
    "dedicated": [LLMDevice(["a"]), LLMDevice(["b"])],
    "replicated": [LLMDevice(["a", "b"]), LLMDevice(["a", "b"])],
    "draft": [LLMDevice(["a"], ["a"]), LLMDevice(["b"], ["b"])],
}
PROFILE_1T = "bench/results/plan/llm-profile-cpu-1t.json"


def profile(path: str, context: int) -> PassProfile:
    if os.path.exists(path):
        prof = PassProfile.load(path)
        if prof.meta.get("decode_context", 8) == context and prof.chunked:
            return prof
    from specserve_bench.passes import profile_passes
    print(f"measuring one-thread pass times into {path} (decode steps at {context} tokens of context)",
          file=sys.stderr, flush=True)
    prof = profile_passes(None, reps=3, threads=1, context=context)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    prof.save(path)
    return prof


def measured(devices: list[LLMDevice], gens, slo: dict, engine: dict, drain_s: float) -> dict:
    with serving(devices, engine) as (port, _):
        results = asyncio.run(replay(port, gens, drain_s))
    ttft = np.array([r.get("ttft", np.nan) for r in results])
    tpot = np.array([r.get("tpot", np.nan) for r in results])
    lim_ttft = np.array([slo[g.model].ttft_s for g in gens])
    lim_tpot = np.array([slo[g.model].tpot_s for g in gens])
    good = ~np.isnan(ttft) & (ttft <= lim_ttft) & (tpot <= lim_tpot)
    return {"attainment": float(good.mean()), "ttft_p50_s": float(np.nanmedian(ttft)), "tpot_p50_s": float(np.nanmedian(tpot)),
            "errors": sum("error" in r for r in results), "first_error": next((r["error"] for r in results if "error" in r), None),
            "ttft_s": [round(float(x), 4) for x in ttft], "tpot_s": [round(float(x), 5) for x in tpot]}


def replica_kv_gib(devices: list[LLMDevice], budget_gb: float, weights_gb: float) -> float:
    """A replica's KV cache (GiB): what the fullest device's budget leaves after its replicas' weights
    (weights_gb a replica), shared among them."""
    most = max(len(d.models) for d in devices)
    return max(0.02, (budget_gb - weights_gb * most) / most / 1.0737)


def together(b: int, replicas_a_model: int, prompt: int, output: int) -> list[Generation]:
    """b generations for every replica of a and of b, all at once, each with a prompt of its own (a call
    with a larger b repeats the smaller's prompts: `batch_runs` serves them without the prefix cache)."""
    return [Generation(1e-3 * j, m, prompt, output) for j, m in enumerate(["a", "b"] * (b * replicas_a_model))]


def batch_runs(name: str, engine: dict, budget_gb: float, weights_gb: float, prompt: int, batches, output: int,
               price) -> list[dict]:
    """Placement `name` served; for each b, `together(b)` measured against price(gens) (a simulation of
    the same generations): each device's time to its last token, the mean TTFT, CPU seconds."""
    placement = PLACEMENTS[name]
    most = max(len(d.models) for d in placement)
    kv_gib = replica_kv_gib(placement, budget_gb, weights_gb)
    out = []
    # no prefix cache: each batch size's generations would find the smaller batches' prompts in it
    with serving(placement, {**engine, "kv_cache_gib": kv_gib, "enable_prefix_caching": False}) as (port, pids):
        for b in batches:
            gens = together(b, most, prompt, output)
            before, t0 = [cpu_s(p) for p in pids], sum(os.times()[:2])
            results = asyncio.run(replay(port, gens, 300))
            after, t1 = [cpu_s(p) for p in pids], sum(os.times()[:2])
            bad = [r["error"] for r in results if "error" in r]
            if bad:
                raise RuntimeError(f"calibration of {name} at batch {b}: {bad[0]}")
            sim = price(placement, gens)
            ends = np.array([g.arrival for g in gens]) + sim.ttft + sim.tpot * (output - 1)
            out.append({"batch": b, "steps_a_device": sim.steps / len(placement),
                        "tokens_a_device": sum(r["tokens"] for r in results) / len(placement),
                        "sim_end_s": float(ends.max()), "end_s": max(r["times"][-1] for r in results),
                        "sim_ttft_s": float(np.mean(sim.ttft)), "ttft_s": float(np.mean([r["ttft"] for r in results])),
                        "replica_cpu_s": sum(after) - sum(before), "driver_cpu_s": t1 - t0})
    return out


def calibrate(prof: PassProfile, draft: DraftSpec, engine: dict, budget_gb: float, prompt: int, batches=(1, 2, 4),
              output: int = 96) -> dict:
    """What serving costs beyond the profile's passes, in wall time: b generations started together on
    every replica, for each b in `batches`, every device busy from the start to its last token.
      dedicated (a replica a device): the time a device took beyond what the simulator prices the same
        generations at, fitted as step_s a step + token_s a streamed token (least squares, both >= 0):
        the replica's own overheads (Ray's threads, streaming) and what the driver (the endpoint and
        the clients, on the same cores) takes from it;
      replicated (two a device): what two replicas sharing a device cost beyond that, as a share of
        the simulated time: switch_cost (simulate_llm);
      draft (EAGLE beside each): the draft's alpha and c as served (a grid, the least squared relative
        error of the devices' end times and the mean TTFT over the batches), for `bench spec` measured
        them on other prompts with every core.
    CPU seconds of the replicas and the driver are kept beside, for the reader."""
    plain = dataclasses.replace(prof, meta={k: v for k, v in prof.meta.items() if k != "served"})
    slo = {m: LLMSLO(1e9, 1e9) for m in "ab"}
    chunk = engine["prefill_chunk"]

    def price(profile, spec=None, **kw):
        return lambda devices, gens: simulate_llm(devices, gens, {"a": profile, "b": profile}, {"a": spec, "b": spec}, slo,
                                                  budget_gb, prefill_chunk=chunk, **kw)
    runs = {n: batch_runs(n, engine, budget_gb, prof.weights_gb, prompt, batches, output, price(plain))
            for n in ("dedicated", "replicated")}
    ded = runs["dedicated"]
    A = np.array([[r["steps_a_device"], r["tokens_a_device"]] for r in ded])
    y = np.array([r["end_s"] - r["sim_end_s"] for r in ded])
    step_s, token_s = np.linalg.lstsq(A, y, rcond=None)[0]
    if token_s < 0:
        step_s, token_s = max(0.0, y.sum() / A[:, 0].sum()), 0.0
    elif step_s < 0:
        step_s, token_s = 0.0, max(0.0, y.sum() / A[:, 1].sum())
    rep = runs["replicated"]
    left = sum(r["end_s"] - r["sim_end_s"] - step_s * r["steps_a_device"] - token_s * r["tokens_a_device"] for r in rep)
    served = {"step_s": float(step_s), "token_s": float(token_s),
              "switch_cost": float(max(0.0, left / sum(r["sim_end_s"] for r in rep)))}

    fitted = dataclasses.replace(prof, meta={**plain.meta, "served": served})
    runs["draft"] = batch_runs("draft", engine, budget_gb, prof.weights_gb + draft.weights_gb, prompt, batches, output,
                               price(fitted, draft))
    best = None
    for alpha in np.arange(0.0, 0.951, 0.05):
        for c in (0.02, 0.04, 0.06, 0.08, 0.1, 0.134, 0.17, 0.2, 0.25, 0.3):
            spec = dataclasses.replace(draft, alpha=float(alpha), c=c)
            err = 0.0
            for r in runs["draft"]:
                gens = together(r["batch"], 1, prompt, output)
                sim = price(fitted, spec)(PLACEMENTS["draft"], gens)
                end = float(np.max(np.array([g.arrival for g in gens]) + sim.ttft + sim.tpot * (output - 1)))
                err += ((end - r["end_s"]) / r["end_s"]) ** 2 + ((float(np.mean(sim.ttft)) - r["ttft_s"]) / r["ttft_s"]) ** 2
            if best is None or err < best[0]:
                best = (err, float(alpha), c)
    return {**served, "draft": {"alpha": best[1], "c": best[2], "rel_error": float(np.sqrt(best[0] / (2 * len(batches)))),
                                "bench_spec": {"alpha": draft.alpha, "c": draft.c}},
            "runs": runs, "prompt": prompt, "output": output, "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--placements", default=",".join(PLACEMENTS),
                    help=f"of {', '.join(PLACEMENTS)}, and planner: the planner's own choice for the trace where it is none of those")
    ap.add_argument("--rates", default="0.4,0.8", help="generations/s over both models: a low and a high load")
    ap.add_argument("--duration", type=float, default=90.0, help="seconds of arrivals per run")
    ap.add_argument("--prompt-median", type=int, default=256)
    ap.add_argument("--output-median", type=int, default=64)
    ap.add_argument("--ttft-scale", type=float, default=5.0, help="TTFT SLO: x the one-thread prefill of the median prompt")
    ap.add_argument("--tpot-scale", type=float, default=3.0, help="TPOT SLO: x one plain batch-1 step at one thread")
    ap.add_argument("--budget-gb", type=float, default=0.6, help="memory per device: weights, then KV")
    ap.add_argument("--drain", type=float, default=120.0, help="seconds after the last arrival before a run is cut")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skew", type=float, default=0.0, help="power-law exponent of the models' shares of the rate (AlpaServe's skew)")
    ap.add_argument("--cv", type=float, default=1.0, help="coefficient of variation of the arrival gaps (1: Poisson)")
    ap.add_argument("--whole-prompts", action="store_true", help="replicas prefill whole prompts (no chunks)")
    ap.add_argument("--calibrate", action="store_true",
                    help="measure what a served replica's step and streamed token cost beyond the profile's pass "
                         "(kept in the profile's meta['served'], which the simulator then adds)")
    ap.add_argument("--sharing", default="processor", choices=("processor", "turns"),
                    help="how the simulator shares a device between its replicas (simulate_llm)")
    ap.add_argument("--profile", default=PROFILE_1T)
    ap.add_argument("--out", default="bench/results/plan")
    ap.add_argument("--report", metavar="JSON", help="only write the markdown of an earlier run's JSON beside it")
    args = ap.parse_args()
    unknown = [n for n in args.placements.split(",") if n not in PLACEMENTS and n != "planner"]
    if unknown:
        ap.error(f"--placements: unknown {unknown[0]!r} (of {', '.join(PLACEMENTS)}, planner)")
    if args.report:
        with open(args.report) as f:
            write_report(json.load(f), os.path.splitext(args.report)[0] + ".md")
        return 0
    from specserve.cli.plan_llm import newest_spec_bench
    from specserve.loading import embedded_model_path
    from specserve_bench.machine import cpu

    prof = profile(args.profile, args.prompt_median)
    engine = {"model": None, "num_threads": 1, "max_model_len": 4096,
              # the chunk the profile was measured with: the simulator prices the same steps
              "prefill_chunk": None if args.whole_prompts else prof.meta["prefill_chunk"]}
    dmeta = prof.meta["draft"]
    spec = newest_spec_bench(model_file=os.path.basename(embedded_model_path()))
    draft = DraftSpec.from_spec_bench(spec, dmeta["weights_gb"], dmeta["kv_gb_per_token"])
    if args.calibrate:
        prof.meta["served"] = calibrate(prof, draft, engine, args.budget_gb, args.prompt_median)
        prof.save(args.profile)
        print(f"served overhead: {json.dumps(prof.meta['served'])}", flush=True)
    served_draft = prof.meta.get("served", {}).get("draft")
    if served_draft:  # the draft as served (calibrate), not as `bench spec` measured it
        draft = dataclasses.replace(draft, alpha=served_draft["alpha"], c=served_draft["c"])
    models = ["a", "b"]
    profiles, drafts = {m: prof for m in models}, {m: draft for m in models}
    slo = {m: LLMSLO(args.ttft_scale * prof.pass_s(args.prompt_median), args.tpot_scale * prof.pass_s(1)) for m in models}
    rows, chosen = [], {}
    for rate in [float(r) for r in args.rates.split(",")]:
        gens = llm_workload(models, rate, args.cv, args.duration, args.seed, skew=args.skew,
                            prompt_median=args.prompt_median, output_median=args.output_median, max_len=2048)
        sim_kw = {"sharing": args.sharing, "prefill_chunk": engine["prefill_chunk"],
                  "switch_cost": prof.meta.get("served", {}).get("switch_cost", 0.0)}
        # what the planner itself would place on these two devices for this trace (Deliver 3: a draft, or
        # one more plain replica), beside the three placements replayed
        plan = plan_llm(models, 2, gens, profiles, drafts, slo, args.budget_gb, **sim_kw)
        key = lambda devs: sorted((sorted(d.models), sorted(d.drafts)) for d in devs)  # noqa: E731
        named = [n for n, devs in PLACEMENTS.items() if key(devs) == key(plan.devices)]
        chosen[f"{rate:g}"] = {"devices": [{"models": d.models, "drafts": d.drafts} for d in plan.devices],
                        "placement": named[0] if named else None, "simulated": plan.result.slo_attainment}
        c = chosen[f"{rate:g}"]
        print(f"at {rate:g}/s the planner places {c['devices']} ({c['placement'] or 'none of the three'}), "
              f"simulated {plan.result.slo_attainment:.3f}", flush=True)
        for name in args.placements.split(","):
            if name == "planner" and named:  # the planner's choice is one of the three: measured as such
                continue
            devices = plan.devices if name == "planner" else PLACEMENTS[name]
            res = simulate_llm(devices, gens, profiles, drafts, slo, args.budget_gb, **sim_kw)
            sim = {**res.summary(), "ttft_s": [round(float(x), 4) for x in res.ttft],
                   "tpot_s": [round(float(x), 5) for x in res.tpot]}
            kv_gib = replica_kv_gib(devices, args.budget_gb, prof.weights_gb + draft.weights_gb)
            real = measured(devices, gens, slo, {**engine, "kv_cache_gib": kv_gib}, args.drain)
            row = {"placement": name, "rate": rate, "generations": len(gens), "simulated": sim, "measured": real,
                   "trace": [[round(g.arrival, 4), g.model, g.prompt_tokens, g.output_tokens] for g in gens]}
            rows.append(row)
            print(f"{name:>10} at {rate:g}/s ({len(gens)} generations): simulated {sim['slo_attainment']:.3f}, "
                  f"measured {real['attainment']:.3f} (TTFT p50 {sim['ttft_p50_s'] * 1e3:.0f} / {real['ttft_p50_s'] * 1e3:.0f} ms, "
                  f"TPOT p50 {sim['tpot_p50_s'] * 1e3:.1f} / {real['tpot_p50_s'] * 1e3:.1f} ms, errors {real['errors']})",
                  flush=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = os.path.join(args.out, f"placement-replay-{stamp}")
    os.makedirs(args.out, exist_ok=True)
    report = {"machine": cpu(), "args": vars(args), "profile": args.profile, "served": prof.meta.get("served"),
              "spec_bench": spec, "planner": chosen,
              "slo_ms": {"ttft": slo["a"].ttft_s * 1e3, "tpot": slo["a"].tpot_s * 1e3}, "rows": rows}
    with open(base + ".json", "w") as f:
        json.dump(report, f, indent=1, default=str)
    write_report(report, base + ".md")
    print(f"{base}.json, {base}.md")
    return 0


def paired(x: dict, y: dict, slo: dict) -> dict:
    """Placement x against y on the same generations: the difference of their attainments, measured (with
    its standard error over the generations, paired: each one met its SLOs in x, in y, or in both) and
    simulated."""
    def good(side, ttft, tpot):
        t, p = np.array(side[ttft], dtype=float), np.array(side[tpot], dtype=float)
        return (~np.isnan(t) & (t <= slo["ttft"] / 1e3 + 1e-9) & (p <= slo["tpot"] / 1e3 + 1e-9)).astype(float)
    d = good(x["measured"], "ttft_s", "tpot_s") - good(y["measured"], "ttft_s", "tpot_s")
    return {"measured": float(d.mean()), "se": float(d.std(ddof=1) / np.sqrt(len(d))),
            "simulated": x["simulated"]["slo_attainment"] - y["simulated"]["slo_attainment"]}


def plot(report: dict, path: str) -> None:
    """Simulated and measured attainment side by side, a panel a rate (measured with +- 1 standard error)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rates = sorted({r["rate"] for r in report["rows"]})
    fig, axs = plt.subplots(1, len(rates), figsize=(4.5 * len(rates), 3.4), squeeze=False)
    for ax, rate in zip(axs[0], rates):
        at = [r for r in report["rows"] if r["rate"] == rate]
        x = np.arange(len(at))
        sim = [r["simulated"]["slo_attainment"] for r in at]
        real = [r["measured"]["attainment"] for r in at]
        se = [np.sqrt(p * (1 - p) / r["generations"]) for p, r in zip(real, at)]
        ax.bar(x - 0.2, sim, 0.4, label="simulated")
        ax.bar(x + 0.2, real, 0.4, yerr=se, capsize=3, label="measured (Ray replicas)")
        ax.set_xticks(x, [r["placement"] for r in at])
        ax.set_ylim(0, 1.05)
        ax.set_title(f"{rate:g} req/s ({at[0]['generations']} generations)", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axs[0][0].set_ylabel("SLO attainment")
    axs[0][0].legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(report: dict, path: str) -> None:
    a, slo = report["args"], report["slo_ms"]
    lines = ["# A plan replayed on real replicas (Ray actors, one core a device)\n",
             f"{report['machine']}; SLO TTFT {slo['ttft']:.0f} ms, TPOT {slo['tpot']:.1f} ms; "
             f"`python bench/placement_replay.py --rates {a['rates']} --duration {a['duration']:g} "
             f"--skew {a.get('skew', 0):g} --cv {a.get('cv', 1):g}`\n",
             "| placement | rate /s | generations | simulated attainment | measured | measured - simulated (pp) "
             "| TTFT p50 sim / real ms | TPOT p50 sim / real ms | errors |", "|---|---|---|---|---|---|---|---|---|"]
    rows = report["rows"]
    for r in rows:
        s, m = r["simulated"], r["measured"]
        lines.append(f"| {r['placement']} | {r['rate']:g} | {r['generations']} | {s['slo_attainment']:.3f} | {m['attainment']:.3f} "
                     f"| {100 * (m['attainment'] - s['slo_attainment']):+.1f} | {s['ttft_p50_s'] * 1e3:.0f} / {m['ttft_p50_s'] * 1e3:.0f} "
                     f"| {s['tpot_p50_s'] * 1e3:.1f} / {m['tpot_p50_s'] * 1e3:.1f} | {m['errors']} |")
    for rate in sorted({r["rate"] for r in rows}):
        at = [r for r in rows if r["rate"] == rate]
        sim = [r["placement"] for r in sorted(at, key=lambda r: -r["simulated"]["slo_attainment"])]
        real = [r["placement"] for r in sorted(at, key=lambda r: -r["measured"]["attainment"])]
        c = report["planner"].get(f"{rate:g}") or report["planner"].get(str(rate)) or {}
        lines.append(f"\nAt {rate:g}/s: simulated ranking {sim}, measured {real}. The planner's own placement: "
                     f"{c.get('devices')} ({c.get('placement') or 'none of the three'}, "
                     f"simulated {c.get('simulated', float('nan')):.3f}).\n")
        lines += ["| pair | measured difference (pp) | its s.e. (paired) | simulated difference (pp) | order |", "|---|---|---|---|---|"]
        for i, x in enumerate(at):
            for y in at[i + 1:]:
                d = paired(x, y, slo)
                if d["measured"] == 0 and abs(d["simulated"]) < 1e-9:
                    order = "equal in both"
                elif d["measured"] == 0 or abs(d["measured"]) < 2 * d["se"]:
                    order = "within noise (< 2 s.e.)"
                else:
                    order = "the same" if d["measured"] * d["simulated"] > 0 else "reversed"
                lines.append(f"| {x['placement']} - {y['placement']} | {100 * d['measured']:+.1f} | {100 * d['se']:.1f} "
                             f"| {100 * d['simulated']:+.1f} | {order} |")
    plot(report, os.path.splitext(path)[0] + ".png")
    lines.insert(1, f"![simulated and measured attainment]({os.path.basename(os.path.splitext(path)[0])}.png)\n")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
