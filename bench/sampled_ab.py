"""Sampled decoding's speed with and without speculation, side by side: tokens/s of regular decoding
(RD) and of the EAGLE draft with BASS batching (fallback on) at T=0.8, top-p 0.95, n samples per
HumanEval chat prompt, EOS ignored so both engines generate the same number of tokens (with EOS the
two draw other samples of other lengths, and a time budget's finished share then mixes speed with
luck: bench/results/nbest-*.md). Seeded requests take the seeded path (their own policy, decided on
the start-up calibration); unseeded ones the shared, live-measured one. Engines alternate prompt by
prompt.

  python bench/sampled_ab.py [--prompts 6] [--batches 1,2,4] [--max-tokens 96] [--out bench/results]
"""
import argparse
import os
import time

from specserve import LLM, SamplingParams
from specserve_bench.humaneval import humaneval_problems
from specserve_bench.machine import cpu
from specserve_bench.spec import chat_prompt

p = argparse.ArgumentParser()
p.add_argument("--prompts", type=int, default=6)
p.add_argument("--batches", default="1,2,4")
p.add_argument("--max-tokens", type=int, default=96)
p.add_argument("--out", default="bench/results")
args = p.parse_args()

kw = dict(enable_prefix_caching=False)
engines = {"RD": LLM(**kw), "spec": LLM(speculative={"method": "draft", "policy": "bass"}, **kw)}
ids = [chat_prompt(engines["RD"], q) for q in humaneval_problems()[:args.prompts]]
rows = []
for seeded in (True, False):
    for n in (int(b) for b in args.batches.split(",")):
        acc = {k: [0, 0.0] for k in engines}
        engines["spec"].reset_spec_stats()
        for i, x in enumerate(ids):
            for name in (list(engines) if i % 2 == 0 else list(reversed(engines))):
                params = SamplingParams(n=n, temperature=0.8, top_p=0.95, seed=10 + i if seeded else None,
                                        max_tokens=args.max_tokens, ignore_eos=True)
                t0 = time.perf_counter()
                out = engines[name].generate(x, params)[0]
                acc[name][1] += time.perf_counter() - t0
                acc[name][0] += sum(len(o.token_ids) for o in out.outputs)
        st = engines["spec"].spec_stats()
        rd, sp = (acc[k][0] / acc[k][1] for k in ("RD", "spec"))
        rows.append((seeded, n, rd, sp, st["spec_steps"], st["fallback_steps"], st["tokens_per_target_step"]))
        print(rows[-1], flush=True)

c = cpu()
lines = ["# Sampled decoding (T=0.8, top-p 0.95), regular vs speculative (EAGLE draft, BASS, fallback on)", "",
         f"CPU: {c['cpu']}, flags {', '.join(c['flags'])}; {args.prompts} HumanEval chat prompts x n samples, "
         f"{args.max_tokens} tokens each (EOS ignored); `python bench/sampled_ab.py`", "",
         "| requests | n | RD tok/s | spec tok/s | spec / RD | drafting steps | plain steps | tokens per target step |",
         "|---|---|---|---|---|---|---|---|"]
for seeded, n, rd, sp, steps, plain, per in rows:
    lines.append(f"| {'seeded' if seeded else 'unseeded'} | {n} | {rd:.1f} | {sp:.1f} | {sp / rd:.3f} | {steps} | {plain} | "
                 f"{per:.2f} |")
os.makedirs(args.out, exist_ok=True)
path = os.path.join(args.out, "sampled-ab-" + time.strftime("%Y%m%d-%H%M%S") + ".md")
with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
print("\n".join(lines))
print("written", path)
