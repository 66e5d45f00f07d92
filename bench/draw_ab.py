"""The sampled-token draw: the kernels' blocked CDF (kernels/sampling.cpp) against torch's sequential
double cumsum (sampler._draw_cumsum), side by side in one process:
  * one row alone, at the vocabularies of SmolLM2 (49k), Qwen2.5 (152k) and Gemma 3 (262k);
  * sampled batch decoding (n seeded samples of one prompt, T = 0.7), the two draws alternated rep by
    rep on one loaded model, ms per step.

    python bench/draw_ab.py [--model gemma-3-270m] [--activations int8] [--batches 8,16] [--tokens 64] [--reps 5]

Writes bench/results/draw-ab-<time>.md.
"""
import argparse
import statistics
import time
from pathlib import Path

import torch

from specserve import LLM, SamplingParams, kernels, system_info
from specserve.sampling import sampler
from specserve.sysinfo import summary_line
from specserve_bench.humaneval import humaneval_prompts

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="gemma-3-270m")
ap.add_argument("--activations", default="int8")
ap.add_argument("--batches", default="8,16")
ap.add_argument("--tokens", type=int, default=64)
ap.add_argument("--reps", type=int, default=5)
args = ap.parse_args()

blocked = sampler.draw_many


def sequential(probs, generators):
    u = torch.cat([torch.rand((1,), generator=g, dtype=torch.float64) for g in generators])
    return [sampler._draw_cumsum(row, ur) for row, ur in zip(probs, u)]


lines = [f"# Sampled-token draws: blocked CDF vs sequential cumsum ({summary_line(system_info())})", "",
         f"`python bench/draw_ab.py --model {args.model} --activations {args.activations} --batches {args.batches} "
         f"--tokens {args.tokens} --reps {args.reps}`", "",
         "| one row of | sequential cumsum, us | blocked (kernels), us | speedup |", "|---|---|---|---|"]
for V in (49152, 151936, 262144):
    probs = torch.softmax(torch.randn(1, V) * 3, dim=-1)
    gens = [torch.Generator().manual_seed(0)]
    times = {}
    for name, fn in (("sequential", sequential), ("blocked", blocked)):
        fn(probs, gens)
        t0 = time.perf_counter()
        for _ in range(200):
            fn(probs, gens)
        times[name] = (time.perf_counter() - t0) / 200 * 1e6
    lines.append(f"| {V} | {times['sequential']:.0f} | {times['blocked']:.0f} | {times['sequential'] / times['blocked']:.1f}x |")
    print(lines[-1], flush=True)

assert kernels.available()
batches = [int(b) for b in args.batches.split(",")]
llm = LLM(args.model, activations=args.activations, kv_cache_gib=0.5, max_num_seqs=max(batches))
prompt = humaneval_prompts(1)[0]
lines += ["", f"Sampled decoding of {args.model} ({args.activations} activations): n seeded samples of one HumanEval "
          f"prompt, T = 0.7, {args.tokens} tokens, EOS ignored; per-token decode latency (TTFT excluded), median / min "
          f"over {args.reps} reps.", "",
          "| batch | sequential cumsum, ms/step | blocked, ms/step | speedup |", "|---|---|---|---|"]
for b in batches:
    sp = SamplingParams(n=b, temperature=0.7, seed=0, max_tokens=args.tokens, ignore_eos=True)
    llm.generate(prompt, sp)  # warm up
    ms = {"sequential": [], "blocked": []}
    for _ in range(args.reps):
        for name, fn in (("sequential", sequential), ("blocked", blocked)):
            sampler.draw_many = fn
            out = llm.generate(prompt, sp)[0]
            ms[name].append(out.metrics["per_token_latency"] * 1e3)
    sampler.draw_many = blocked
    s, k = ms["sequential"], ms["blocked"]
    lines.append(f"| {b} | {statistics.median(s):.2f} / {min(s):.2f} | {statistics.median(k):.2f} / {min(k):.2f} | "
                 f"{statistics.median(s) / statistics.median(k):.2f}x |")
    print(lines[-1], flush=True)

out = Path(__file__).parent / "results" / f"draw-ab-{time.strftime('%Y%m%d-%H%M%S')}.md"
out.write_text("\n".join(lines) + "\n")
print(f"wrote {out}")
