"""What a further row costs in each activation mode: bare target passes over 1 .. 16 rows, timed as the
cost model calibrates them at start-up (speculative/calibration.py: the curve the per-step and
per-sequence choices read), for fp32 and int8 activations side by side in one run.

A verify pass over 1 + k rows and a batch of B sequences both pay (rows - 1) further rows on top of a
one-row pass; the int8 mode's point is that those rows are several times cheaper (issue 37).

    python bench/row_cost.py [--model NAME] [--threads 2]  ->  bench/results/row-cost-<time>.{md,json}
"""
import argparse
import json
import os
import time

import torch

from specserve import LLM
from specserve.config import ACTIVATIONS
from specserve.speculative import CostModel, calibrate
from specserve_bench.machine import cpu

ROWS = (1, 2, 3, 4, 6, 8, 12, 16)


def curve(model: str, activations: str, repeats: int) -> dict[int, float]:
    """rows -> seconds of a bare pass (the fastest of `repeats` calibrations)."""
    llm = LLM(model, activations=activations, kv_cache_gib=0.25, prefill_chunk=None)
    eng, best = llm.engine, {}
    for _ in range(repeats):
        c = CostModel()
        calibrate(c, eng.model, eng.kv, eng.scheduler.blocks, "split", "split", max_rows=max(ROWS), rows=ROWS)
        best = {n: min(best.get(n, float("inf")), t) for n, t in c.calibrated.items()}
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    machine = cpu()
    t = {mode: curve(args.model, mode, args.repeats) for mode in ACTIVATIONS}
    extra = {mode: (c[16] - c[1]) / 15 for mode, c in t.items()}  # seconds per further row
    lines = [f"# A further row's cost by activation mode: {args.model}", "",
             f"CPU: {machine['cpu']}; {', '.join(machine['flags'])}; {args.threads} threads. "
             f"`python bench/row_cost.py --model {args.model} --threads {args.threads}`: bare target passes, the "
             f"fastest of {args.repeats} start-up calibrations each.", "",
             "| rows | " + " | ".join(f"{m} ms" for m in ACTIVATIONS) + " | fp32 / int8 |", "|---|---|---|---|"]
    lines += [f"| {n} | " + " | ".join(f"{1e3 * t[m][n]:.1f}" for m in ACTIVATIONS) + f" | {t['fp32'][n] / t['int8'][n]:.2f}x |"
              for n in ROWS]
    lines += ["", "| | " + " | ".join(ACTIVATIONS) + " | fp32 / int8 |", "|---|---|---|---|",
              "| a further row, ms ((16 rows - 1 row) / 15) | " + " | ".join(f"{1e3 * extra[m]:.2f}" for m in ACTIVATIONS)
              + f" | **{extra['fp32'] / extra['int8']:.2f}x** |",
              "| a further row / a one-row pass | " + " | ".join(f"{extra[m] / t[m][1]:.3f}" for m in ACTIVATIONS) + " | |"]
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, "row-cost-" + time.strftime("%Y%m%d-%H%M%S"))
    with open(stem + ".json", "w") as f:
        json.dump({"model": args.model, "machine": machine, "threads": args.threads, "rows": ROWS,
                   "seconds": {m: {str(n): s for n, s in c.items()} for m, c in t.items()},
                   "extra_row_seconds": extra}, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\nwritten to {stem}.{{md,json}}")


if __name__ == "__main__":
    main()
