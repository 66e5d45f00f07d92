"""glibc's malloc defaults against engine/malloc.py's setting (freed step memory kept mapped), side by
side: the setting is process-wide, so each run is a fresh process, the two alternated round by round.
Sampled batch decoding (n seeded samples of one HumanEval prompt, T = 0.7, EOS ignored), ms per step,
and each process's peak RSS.

    python bench/malloc_ab.py [--models gemma-3-270m,qwen2.5-coder-1.5b] [--activations int8]
                              [--batches 1,8,16] [--tokens 48] [--rounds 3]

Writes bench/results/malloc-ab-<time>.md.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CHILD = """
import json, resource, sys
from specserve import LLM, SamplingParams
from specserve_bench.humaneval import humaneval_prompts
model, act, batches, tokens = sys.argv[1], sys.argv[2], [int(b) for b in sys.argv[3].split(",")], int(sys.argv[4])
llm = LLM(model, activations=act, kv_cache_gib=0.5, max_num_seqs=max(batches))
prompt = humaneval_prompts(1)[0]
ms = {}
for b in batches:
    sp = SamplingParams(n=b, temperature=0.7, seed=0, max_tokens=tokens, ignore_eos=True)
    llm.generate(prompt, sp)  # warm up
    ms[b] = llm.generate(prompt, sp)[0].metrics["per_token_latency"] * 1e3
print(json.dumps({"ms": ms, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

ap = argparse.ArgumentParser()
ap.add_argument("--models", default="gemma-3-270m,qwen2.5-coder-1.5b")
ap.add_argument("--activations", default="int8")
ap.add_argument("--batches", default="1,8,16")
ap.add_argument("--tokens", type=int, default=48)
ap.add_argument("--rounds", type=int, default=3)
args = ap.parse_args()

from specserve import system_info  # noqa: E402  (after argparse: --help stays instant)
from specserve.sysinfo import summary_line  # noqa: E402

SETTINGS = {"glibc defaults": {"SPECSERVE_NO_MALLOPT": "1"}, "kept mapped": {}}
batches = [int(b) for b in args.batches.split(",")]
lines = [f"# malloc: glibc's defaults vs freed step memory kept mapped ({summary_line(system_info())})", "",
         f"`python bench/malloc_ab.py --models {args.models} --activations {args.activations} --batches {args.batches} "
         f"--tokens {args.tokens} --rounds {args.rounds}`: n seeded samples of one HumanEval prompt, T = 0.7, "
         f"ms per step (median over rounds, a fresh process each), peak RSS.", "",
         "| model | batch | glibc defaults, ms/step | kept mapped, ms/step | speedup |", "|---|---|---|---|---|"]
rss_lines = []
for model in args.models.split(","):
    runs = {name: [] for name in SETTINGS}
    for _ in range(args.rounds):
        for name, env in SETTINGS.items():
            env_all = {k: v for k, v in os.environ.items() if k != "SPECSERVE_NO_MALLOPT"} | env
            out = subprocess.run([sys.executable, "-c", CHILD, model, args.activations, args.batches, str(args.tokens)],
                                 capture_output=True, text=True, env=env_all, check=True).stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
            print(model, name, runs[name][-1], flush=True)
    for b in batches:
        d, k = (statistics.median(r["ms"][str(b)] for r in runs[name]) for name in SETTINGS)
        lines.append(f"| {model} | {b} | {d:.2f} | {k:.2f} | {d / k:.2f}x |")
    rss = {name: max(r["rss_mb"] for r in runs[name]) for name in SETTINGS}
    rss_lines.append(f"| {model} | {rss['glibc defaults']:.0f} MB | {rss['kept mapped']:.0f} MB |")
lines += ["", "| model | peak RSS, glibc defaults | kept mapped |", "|---|---|---|"] + rss_lines
out = Path(__file__).parent / "results" / f"malloc-ab-{time.strftime('%Y%m%d-%H%M%S')}.md"
out.write_text("\n".join(lines) + "\n")
print("\n".join(lines))
print(f"wrote {out}")
