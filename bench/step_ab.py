"""Milliseconds per token with speculation decisions fixed (cost-model fallback off), to compare two
checkouts' per-step cost side by side: run it alternately in each checkout (PYTHONPATH=CHECKOUT),
several times, and compare minima and medians (one run moves by 10%+ with this VM).

    python bench/step_ab.py LABEL [--method lookup+draft] [--batch 1] [--tokens 96] [--reps 6]
"""
import argparse
import time

from specserve import LLM, SamplingParams
from specserve_bench.humaneval import humaneval_prompts

ap = argparse.ArgumentParser()
ap.add_argument("label")
ap.add_argument("--method", default="lookup+draft", help="a speculative method, or none")
ap.add_argument("--batch", type=int, default=1)
ap.add_argument("--tokens", type=int, default=96)
ap.add_argument("--reps", type=int, default=6)
args = ap.parse_args()
prompts = humaneval_prompts(max(2, args.batch))
sp = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
spec = None if args.method == "none" else {"method": args.method, "fallback": False}
llm = LLM(speculative=spec, max_num_seqs=max(8, args.batch))
llm.generate(prompts[:1], sp)  # warm up
ms = []
for _ in range(args.reps):
    t0 = time.perf_counter()
    if args.batch == 1:
        for p in prompts[:2]:
            llm.generate(p, sp)
        ms.append(1e3 * (time.perf_counter() - t0) / (2 * args.tokens))
    else:
        llm.generate(prompts[:args.batch], sp)
        ms.append(1e3 * (time.perf_counter() - t0) / args.tokens)  # per step of the whole batch
ms.sort()
print(f"{args.label} {args.method} batch {args.batch}: min {ms[0]:.2f} median {ms[len(ms) // 2]:.2f} ms/token", flush=True)
