"""Threads and OpenMP wait policy on a shared machine (issue 18, item 5).

Each variant runs in a fresh interpreter (OpenMP reads its environment when torch loads), once on an
idle machine and once beside one competing busy process (what a shared 2-core VM sees when anything
else runs). A variant times
`LLM.generate` of 10 HumanEval prompts x 24 greedy tokens (one batch) and one prompt x 48 tokens
(batch 1), best of `--reps` after a warm-up.

    python bench/threads.py [--reps 3] [--out bench/results/threads-DATE.md]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time

CHILD = r"""
import json, sys, time
from specserve import LLM, SamplingParams
from specserve_bench.humaneval import humaneval_prompts
threads = int(sys.argv[1]) or None
reps = int(sys.argv[2])
llm = LLM(num_threads=threads, speculative=None)
if sys.argv[3] == "off":
    llm.engine.threads = None  # the thread governor off: every core for every step, as before it existed
import torch
prompts = humaneval_prompts(10)
batch, single = SamplingParams(temperature=0, max_tokens=24), SamplingParams(temperature=0, max_tokens=48)
llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=4))
def best(fn):
    ts = []
    for _ in range(reps):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    return min(ts)
out = {"threads": torch.get_num_threads(),
       "batch10_s": best(lambda: llm.generate(prompts, batch)),
       "batch1_s": best(lambda: llm.generate(prompts[0], single)),
       "governor": [] if llm.engine.threads is None else llm.engine.threads.changes[:20]}
print("RESULT " + json.dumps(out))
"""

VARIANTS = [  # (label, extra environment, num_threads: 0 = the default, thread governor on/off)
    ("specserve default: all cores, spin, thread governor", {}, 0, "on"),
    ("all cores, spin, no governor (before issue 18)", {}, 0, "off"),
    ("all cores, OMP_WAIT_POLICY=PASSIVE, no governor", {"OMP_WAIT_POLICY": "PASSIVE"}, 0, "off"),
    ("all cores, GOMP_SPINCOUNT=10000, no governor", {"GOMP_SPINCOUNT": "10000"}, 0, "off"),
    ("--threads 1", {}, 1, "off"),
]


def _busy(stop):
    x = 0
    while not stop.is_set():
        x += 1


def run_variant(env_extra: dict, threads: int, governor: str, reps: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
    env.update(env_extra)
    r = subprocess.run([sys.executable, "-c", CHILD, str(threads), str(reps), governor], env=env, capture_output=True,
                       text=True, timeout=900)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    if r.returncode or not line:
        raise RuntimeError(f"variant failed: {r.stderr[-2000:]}")
    return json.loads(line[0][7:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default=f"bench/results/threads-{time.strftime('%Y%m%d')}.md")
    args = ap.parse_args()
    from specserve_bench.machine import cpu
    m = cpu()
    model, flags = m["cpu"], " ".join(m["flags"])
    rows = []
    for label, env, threads, governor in VARIANTS:
        idle = run_variant(env, threads, governor, args.reps)
        stop = mp.Event()
        hog = mp.Process(target=_busy, args=(stop,), daemon=True)
        hog.start()
        try:
            busy = run_variant(env, threads, governor, args.reps)
        finally:
            stop.set()
            hog.join(5)
            if hog.is_alive():
                hog.kill()
        rows.append((label, idle, busy))
        print(f"{label:50s} idle {idle['batch10_s']:.2f}s / {idle['batch1_s']:.2f}s   "
              f"1 busy process {busy['batch10_s']:.2f}s / {busy['batch1_s']:.2f}s", flush=True)
    lines = [f"# Threads and OpenMP wait policy, idle vs one competing busy process ({time.strftime('%Y-%m-%d')})", "",
             f"CPU: {model}, {os.cpu_count()} cores, flags {flags}. `python bench/threads.py --reps {args.reps}`; "
             "best of the reps, seconds (lower is better). batch 10 = 10 HumanEval prompts x 24 greedy tokens in one "
             "generate; batch 1 = one prompt x 48 tokens.", "",
             "| variant | threads | idle batch 10 | idle batch 1 | busy batch 10 | busy batch 1 | busy/idle (batch 10) |",
             "|---|---|---|---|---|---|---|"]
    for label, idle, busy in rows:
        lines.append(f"| {label} | {idle['threads']} | {idle['batch10_s']:.2f} | {idle['batch1_s']:.2f} | "
                     f"{busy['batch10_s']:.2f} | {busy['batch1_s']:.2f} | {busy['batch10_s'] / idle['batch10_s']:.1f}x |")
    gov = rows[0]
    lines += ["", f"Governor switches (threads, measured core share): idle {gov[1]['governor']}, busy {gov[2]['governor']}."]
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
