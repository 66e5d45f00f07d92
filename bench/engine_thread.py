"""Which thread steps the engine: a decode token's time with the model loaded on one thread and
stepped on another (docs/decisions.md#engine-thread).

libgomp keeps a pool of OpenMP threads for each thread that runs parallel regions. When the pools'
threads outnumber the cores, its workers spin ~100 times instead of ~300,000 before sleeping, so
every one of a step's hundreds of parallel regions pays a wake-up. AsyncLLM (the server's engine)
once loaded its model on the caller's thread and stepped it on its own; an LLM now frees the loading
thread's pool once built, and each caller's when generate returns (engine/omp_pool.py). Variants, each
in a fresh interpreter, in turns:
- `same`: LLM.generate on the thread that loaded the model (the offline API);
- `other`: LLM.generate on a second thread (a web handler's), as the LLM is now;
- `kept`: the same with the loading thread's pool alive again (a parallel torch op run on it after the
  build: what every LLM did before it freed its pools, and what a program's own torch work on that
  thread still does; AsyncLLM before it built on its own thread);
- `async`: AsyncLLM (built on the thread that steps it).
Each reports the median ms per decoded token of --reps greedy generations (after a warm-up: the
engine's own per-token figure for `same` and `other`, the time between the first and last streamed
deltas for `async`) and the thread count the governor (engine/threads.py) ended on.

    python bench/engine_thread.py [--model qwen2.5-coder-1.5b] [--activations int8] [--rounds 2] [--threads N]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CHILD = r"""
import asyncio, json, statistics, sys, threading, time
from specserve import LLM, AsyncLLM, SamplingParams
variant, model, activations, reps, tokens = sys.argv[1], sys.argv[2] or None, sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
threads = int(sys.argv[6]) or None  # a pinned count: no governor
prompt = "def quicksort(arr):\n"
params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
def per_token(llm):
    return llm.generate(prompt, params)[0].metrics["per_token_latency"] * 1e3
times = []
if variant == "async":
    llm = AsyncLLM(model, activations=activations, num_threads=threads)
    async def one():
        first = last = None
        async for _ in llm.generate(prompt, params):
            last = time.perf_counter()
            first = first or last
        return (last - first) / (tokens - 1) * 1e3
    for _ in range(reps + 1):
        times.append(asyncio.run(one()))
    engine = llm.engine
    llm.shutdown()
else:
    llm = LLM(model, activations=activations, num_threads=threads)
    def run():
        for _ in range(reps + 1):
            times.append(per_token(llm))
    if variant == "kept":
        import torch
        torch.randn(1 << 20).exp_()  # a parallel region: this thread's pool again
    if variant == "same":
        run()
    else:
        t = threading.Thread(target=run)
        t.start()
        t.join()
    engine = llm.engine
gov = engine.threads
print(json.dumps({"ms_per_token": statistics.median(times[1:]), "runs": times[1:],
                  "threads_at_end": gov.threads if gov else None, "governor_changes": len(gov.changes) if gov else 0}))
"""

VARIANTS = ("same", "other", "kept", "async")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="", help="a known model's name or a path (default: the embedded model)")
    ap.add_argument("--activations", default="fp32", choices=("fp32", "int8"))
    ap.add_argument("--rounds", type=int, default=2, help="turns over the variants")
    ap.add_argument("--reps", type=int, default=2, help="generations per variant and turn (after a warm-up)")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=0, help="pin the engine's thread count (no governor); 0: the governor")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    rows: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        for v in VARIANTS:
            p = subprocess.run([sys.executable, "-c", CHILD, v, args.model, args.activations, str(args.reps),
                                str(args.tokens), str(args.threads)], capture_output=True, text=True, timeout=1800)
            if p.returncode != 0:
                raise RuntimeError(f"variant {v} failed: {p.stderr[-800:]}")
            rows[v].append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {v:6s} {rows[v][-1]['ms_per_token']:.1f} ms/token, threads at the end "
                  f"{rows[v][-1]['threads_at_end']}", flush=True)
    from specserve_bench import machine
    m = machine.cpu()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = os.path.join(args.out, f"engine-thread-{stamp}")
    os.makedirs(args.out, exist_ok=True)
    with open(path + ".json", "w") as f:
        json.dump({"machine": {**m, "cores": os.cpu_count()}, "settings": vars(args), "rows": rows}, f, indent=1)
    lines = [f"# Which thread steps the engine ({stamp})", "",
             f"CPU: {m['cpu']}, {os.cpu_count()} cores, flags {' '.join(m['flags'])}. Model `{args.model or 'embedded'}`, "
             f"{args.activations} activations, {args.tokens} greedy tokens, median of {args.reps} per turn, "
             f"{args.rounds} turns. `python bench/engine_thread.py{' --model ' + args.model if args.model else ''} "
             f"--activations {args.activations} --rounds {args.rounds} --reps {args.reps} --tokens {args.tokens}"
             f"{f' --threads {args.threads}' if args.threads else ''}`", "",
             "| variant | ms per token, each turn | threads the governor ended on |", "|---|---|---|"]
    names = {"same": "LLM.generate on the loading thread", "other": "LLM.generate on another thread",
             "kept": "on another thread, the loading thread's pool alive (before)",
             "async": "AsyncLLM (built on its stepping thread)"}
    for v in VARIANTS:
        per_turn = " / ".join(f"{x['ms_per_token']:.1f}" for x in rows[v])
        threads = " / ".join(str(x["threads_at_end"] or f"{args.threads} (pinned)") for x in rows[v])
        lines.append(f"| {names[v]} | {per_turn} | {threads} |")
    with open(path + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {path}.json and .md")


if __name__ == "__main__":
    main()
