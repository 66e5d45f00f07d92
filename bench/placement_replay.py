"""A plan replayed on real replicas (issue 38, Deliver 2): the LLM planner's simulated SLO attainment
against the attainment measured through the OpenAI endpoint, on the same workload trace, for three
placements of two models on two devices, at a low and a high load. AlpaServe closes this loop for its
one-shot models (`specserve plan replay`); this is the same check for LLM generations.

    python bench/placement_replay.py [--rates 0.4,2] [--duration 90] [--placements dedicated,replicated,draft]

A planner device is one core here: each replica is a Ray actor pinned to its device's core with one
engine thread, and the simulator reads a pass profile measured with one thread (made on first use,
kept in bench/results/plan/llm-profile-cpu-1t.json, its decode steps timed at the trace's median prompt
length of context). The two models are the embedded model twice
(the planner sees two models with their own arrivals); "draft" carries the EAGLE draft beside each.
Each request is streamed (ignore_eos, its trace's prompt and output lengths); TTFT is the first
token's arrival, TPOT the time after it over the remaining tokens, as the simulator defines them.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time

import numpy as np

from specserve.planner.llm import LLMSLO, DraftSpec, Generation, LLMDevice, PassProfile, llm_workload, simulate_llm
from specserve.planner.llm_search import plan_llm

PLACEMENTS = {
    "dedicated": [LLMDevice(["a"]), LLMDevice(["b"])],
    "replicated": [LLMDevice(["a", "b"]), LLMDevice(["a", "b"])],
    "draft": [LLMDevice(["a"], ["a"]), LLMDevice(["b"], ["b"])],
}
PROFILE_1T = "bench/results/plan/llm-profile-cpu-1t.json"


def profile(path: str, context: int) -> PassProfile:
    if os.path.exists(path):
        prof = PassProfile.load(path)
        if prof.meta.get("decode_context", 8) == context:
            return prof
    from specserve_bench.passes import profile_passes
    print(f"measuring one-thread pass times into {path} (decode steps at {context} tokens of context)",
          file=sys.stderr, flush=True)
    prof = profile_passes(None, reps=3, threads=1, context=context)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    prof.save(path)
    return prof


def serve_in_thread(app):
    """uvicorn on a free loopback port in a daemon thread; returns (server, port)."""
    import uvicorn

    from specserve.server.http import uvicorn_config
    srv = uvicorn.Server(uvicorn_config(app, "127.0.0.1", 0, log_level="warning"))
    threading.Thread(target=srv.run, daemon=True).start()
    deadline = time.time() + 60
    while not srv.started and time.time() < deadline:
        time.sleep(0.05)
    if not srv.started:
        raise RuntimeError("the server did not start within 60 s")
    return srv, srv.servers[0].sockets[0].getsockname()[1]


async def one(client, g, sem, t0: float, vocab: int) -> dict:
    """Stream one generation; its TTFT from its arrival, and TPOT over the tokens after the first."""
    ids = [int(g.arrival * 1000 + 7919 * i) % (vocab - 200) + 100 for i in range(g.prompt_tokens)]
    async with sem:
        first = last = None
        tokens = 0
        try:
            stream = await client.completions.create(
                model=g.model, prompt=ids, max_tokens=g.output_tokens, temperature=0, stream=True,
                stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
            async for ch in stream:
                now = time.perf_counter()
                if ch.choices and ch.choices[0].text:
                    first = first if first is not None else now
                    last = now
                if ch.usage is not None:
                    tokens = ch.usage.completion_tokens
        except Exception as e:  # counted as not served: the run goes on
            return {"error": f"{type(e).__name__}: {str(e)[:120]}"}
    if first is None:
        return {"error": "no token"}
    ttft = first - (t0 + g.arrival)
    tpot = (last - first) / (tokens - 1) if tokens > 1 else 0.0
    return {"ttft": ttft, "tpot": tpot, "tokens": tokens}


async def replay(port: int, gens, vocab: int, drain_s: float) -> list[dict]:
    from openai import AsyncOpenAI
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", max_retries=0, timeout=600)
    sem = asyncio.Semaphore(256)
    t0 = time.perf_counter()
    tasks = []
    for g in gens:
        delay = t0 + g.arrival - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(client, g, sem, t0, vocab)))
    done, pending = await asyncio.wait(tasks, timeout=drain_s)
    for t in pending:  # bounded: what has not finished by then did not meet its SLO
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    await client.close()
    return [t.result() if t in done else {"error": "not finished"} for t in tasks]


def measured(devices: list[LLMDevice], gens, slo: dict, kv_gib: float, drain_s: float, whole_prompts: bool) -> dict:
    from specserve.cluster.placement import ReplicaSpec, ServePlacement
    from specserve.cluster.router import ReplicaSet
    from specserve.server.app import build_app
    engine = {"model": None, "num_threads": 1, "kv_cache_gib": kv_gib, "max_model_len": 4096}
    if whole_prompts:  # as the simulator admits them: a prompt in one step, not in SARATHI chunks
        engine["prefill_chunk"] = None
    replicas = [ReplicaSpec(m, device=d, cores=(d % (os.cpu_count() or 1),),
                            overrides={"speculative": "draft"} if m in dev.drafts else {})
                for d, dev in enumerate(devices) for m in dev.models]
    placement = ServePlacement({"a": dict(engine), "b": dict(engine)}, replicas)
    rs = ReplicaSet(placement, num_cpus=os.cpu_count())
    try:
        srv, port = serve_in_thread(build_app(rs))
        vocab = 49152  # the embedded model's
        # warm every replica (kernels, the draft's first pass) before the clock starts
        warm = [Generation(0.0, m, 16, 4) for m in ("a", "b") for _ in range(2)]
        asyncio.run(replay(port, warm, vocab, 120))
        results = asyncio.run(replay(port, gens, vocab, drain_s))
        srv.should_exit = True
    finally:
        rs.shutdown()
    ttft = np.array([r.get("ttft", np.nan) for r in results])
    tpot = np.array([r.get("tpot", np.nan) for r in results])
    lim_ttft = np.array([slo[g.model].ttft_s for g in gens])
    lim_tpot = np.array([slo[g.model].tpot_s for g in gens])
    good = ~np.isnan(ttft) & (ttft <= lim_ttft) & (tpot <= lim_tpot)
    return {"attainment": float(good.mean()), "ttft_p50_s": float(np.nanmedian(ttft)), "tpot_p50_s": float(np.nanmedian(tpot)),
            "errors": sum("error" in r for r in results), "first_error": next((r["error"] for r in results if "error" in r), None),
            "ttft_s": [round(float(x), 4) for x in ttft], "tpot_s": [round(float(x), 5) for x in tpot]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--placements", default=",".join(PLACEMENTS))
    ap.add_argument("--rates", default="0.4,2", help="generations/s over both models: a low and a high load")
    ap.add_argument("--duration", type=float, default=90.0, help="seconds of arrivals per run")
    ap.add_argument("--prompt-median", type=int, default=256)
    ap.add_argument("--output-median", type=int, default=64)
    ap.add_argument("--ttft-scale", type=float, default=5.0, help="TTFT SLO: x the one-thread prefill of the median prompt")
    ap.add_argument("--tpot-scale", type=float, default=3.0, help="TPOT SLO: x one plain batch-1 step at one thread")
    ap.add_argument("--budget-gb", type=float, default=0.6, help="memory per device: weights, then KV")
    ap.add_argument("--drain", type=float, default=120.0, help="seconds after the last arrival before a run is cut")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--whole-prompts", action="store_true", help="replicas prefill whole prompts (no chunks)")
    ap.add_argument("--sharing", default="processor", choices=("processor", "turns"),
                    help="how the simulator shares a device between its replicas (simulate_llm)")
    ap.add_argument("--profile", default=PROFILE_1T)
    ap.add_argument("--out", default="bench/results/plan")
    args = ap.parse_args()
    from specserve.cli.plan_llm import newest_spec_bench
    from specserve.loading import embedded_model_path
    from specserve_bench.machine import cpu

    prof = profile(args.profile, args.prompt_median)
    dmeta = prof.meta["draft"]
    spec = newest_spec_bench(model_file=os.path.basename(embedded_model_path()))
    draft = DraftSpec.from_spec_bench(spec, dmeta["weights_gb"], dmeta["kv_gb_per_token"])
    models = ["a", "b"]
    profiles, drafts = {m: prof for m in models}, {m: draft for m in models}
    slo = {m: LLMSLO(args.ttft_scale * prof.pass_s(args.prompt_median), args.tpot_scale * prof.pass_s(1)) for m in models}
    rows, chosen = [], {}
    for rate in [float(r) for r in args.rates.split(",")]:
        gens = llm_workload(models, rate, 1.0, args.duration, args.seed, prompt_median=args.prompt_median,
                            output_median=args.output_median, max_len=2048)
        # what the planner itself would place on these two devices for this trace (Deliver 3: a draft, or
        # one more plain replica), beside the three placements replayed
        plan = plan_llm(models, 2, gens, profiles, drafts, slo, args.budget_gb, sharing=args.sharing)
        key = lambda devs: sorted((sorted(d.models), sorted(d.drafts)) for d in devs)  # noqa: E731
        named = [n for n, devs in PLACEMENTS.items() if key(devs) == key(plan.devices)]
        chosen[rate] = {"devices": [{"models": d.models, "drafts": d.drafts} for d in plan.devices],
                        "placement": named[0] if named else None, "simulated": plan.result.slo_attainment}
        print(f"at {rate:g}/s the planner places {chosen[rate]['devices']} ({chosen[rate]['placement'] or 'none of the three'}), "
              f"simulated {plan.result.slo_attainment:.3f}", flush=True)
        for name in args.placements.split(","):
            devices = PLACEMENTS[name]
            res = simulate_llm(devices, gens, profiles, drafts, slo, args.budget_gb, sharing=args.sharing)
            sim = {**res.summary(), "ttft_s": [round(float(x), 4) for x in res.ttft],
                   "tpot_s": [round(float(x), 5) for x in res.tpot]}
            most = max(len(d.models) for d in devices)
            kv_gib = max(0.02, (args.budget_gb - prof.weights_gb * most - draft.weights_gb * most) / most / 1.0737)
            real = measured(devices, gens, slo, kv_gib, args.drain, args.whole_prompts)
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
    report = {"machine": cpu(), "args": vars(args), "profile": args.profile, "spec_bench": spec, "planner": chosen,
              "slo_ms": {"ttft": slo["a"].ttft_s * 1e3, "tpot": slo["a"].tpot_s * 1e3}, "rows": rows}
    with open(base + ".json", "w") as f:
        json.dump(report, f, indent=1, default=str)
    lines = ["# A plan replayed on real replicas (Ray actors, one core a device)\n",
             f"{report['machine']}; SLO TTFT {slo['a'].ttft_s * 1e3:.0f} ms, TPOT {slo['a'].tpot_s * 1e3:.1f} ms; "
             f"`python bench/placement_replay.py --rates {args.rates} --duration {args.duration:g}`\n",
             "| placement | rate /s | generations | simulated attainment | measured | measured - simulated (pp) "
             "| TTFT p50 sim / real ms | TPOT p50 sim / real ms | errors |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s, m = r["simulated"], r["measured"]
        lines.append(f"| {r['placement']} | {r['rate']:g} | {r['generations']} | {s['slo_attainment']:.3f} | {m['attainment']:.3f} "
                     f"| {100 * (m['attainment'] - s['slo_attainment']):+.1f} | {s['ttft_p50_s'] * 1e3:.0f} / {m['ttft_p50_s'] * 1e3:.0f} "
                     f"| {s['tpot_p50_s'] * 1e3:.1f} / {m['tpot_p50_s'] * 1e3:.1f} | {m['errors']} |")
    for rate in sorted({r["rate"] for r in rows}):
        at = [r for r in rows if r["rate"] == rate]
        sim = [r["placement"] for r in sorted(at, key=lambda r: -r["simulated"]["slo_attainment"])]
        real = [r["placement"] for r in sorted(at, key=lambda r: -r["measured"]["attainment"])]
        c = chosen[rate]
        lines.append(f"\nAt {rate:g}/s: simulated ranking {sim}, measured {real}. The planner's own placement: "
                     f"{c['devices']} ({c['placement'] or 'none of the three'}, simulated {c['simulated']:.3f}).")
    with open(base + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{base}.json, {base}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
