"""What a further row costs in each activation mode: bare target passes over 1 .. 16 rows, timed as the
cost model calibrates them at start-up (speculative/calibration.py: the curve the per-step and
per-sequence choices read), for fp32 and int8 activations side by side in one run.

A verify pass over 1 + k rows and a batch of B sequences both pay (rows - 1) further rows on top of a
one-row pass; the int8 mode's point is that those rows are several times cheaper (issue 37).

    python bench/row_cost.py [--model NAME] [--threads 2] [--rows 1,8,16,32,40] [--int8-builds amx,vnni]
                             [--peers hf,llama.cpp]
        ->  bench/results/row-cost-<time>.{md,json}

Peers on the same file, in the same run: HF transformers (dense fp32, its forward over n rows after the
same context, a DynamicCache cropped back after each) and llama.cpp (8-bit activations as the int8 mode,
llama_decode over n rows with logits at every row; where installed, `make llamacpp`).

On an AMX CPU, `--int8-builds amx,vnni --rows 1,2,4,8,16,24,32,40` puts the AMX build beside VNNI
(docs/decisions.md#amx-int8).
"""
import argparse
import json
import os
import sys
import time

import torch

from specserve import LLM, kernels
from specserve.loading import resolve_model_path
from specserve.speculative import CostModel, calibrate
from specserve_bench.machine import cpu
from specserve_bench.peers import llama_cpp_available, llama_cpp_pass_curve, load_hf

ROWS = (1, 2, 3, 4, 6, 8, 12, 16)


def curve(model: str, activations: str, repeats: int, rows: tuple[int, ...]) -> dict[int, float]:
    """rows -> seconds of a bare pass (the fastest of `repeats` calibrations)."""
    llm = LLM(model, activations=activations, kv_cache_gib=0.25, prefill_chunk=None)
    eng, best = llm.engine, {}
    for _ in range(repeats):
        c = CostModel()
        calibrate(c, eng.model, eng.kv, eng.scheduler.blocks, "split", "split", max_rows=max(rows), rows=rows)
        best = {n: min(best.get(n, float("inf")), t) for n, t in c.calibrated.items()}
    return best


@torch.inference_mode()
def hf_curve(path: str, repeats: int, rows: tuple[int, ...], context: int = 128) -> dict[int, float]:
    """HF transformers' fp32 forward over n rows after `context` tokens (logits at every row)."""
    model = load_hf(path, torch.float32)
    ids = torch.arange(1000, 1000 + context + max(rows)).unsqueeze(0) % model.config.vocab_size
    cache = model(ids[:, :context], use_cache=True).past_key_values
    best: dict[int, float] = {}
    for n in [rows[0]] + list(rows):  # the first pass warms up
        for _ in range(repeats):
            t0 = time.perf_counter()
            model(ids[:, context:context + n], past_key_values=cache, use_cache=True)
            best[n] = min(best.get(n, float("inf")), time.perf_counter() - t0)
            cache.crop(context - cache.get_seq_length())  # a negative count: the rows just added
    return best


def int8_curve(model: str, build: str, repeats: int, rows: tuple[int, ...]) -> dict[int, float]:
    """The int8 curve on one build of the kernels (every build gives the same bits: only the time moves)."""
    ext = kernels.ext()
    before = ext.q8_kernel_build()
    if ext.q8_kernel_build(build) != build:
        ext.q8_kernel_build(before)
        raise SystemExit(f"this CPU cannot run the int8 kernels' {build} build")
    try:
        return curve(model, "int8", repeats, rows)
    finally:
        ext.q8_kernel_build(before)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rows", default=",".join(map(str, ROWS)), help="pass sizes to time (first 1)")
    ap.add_argument("--int8-builds", default="",
                    help="int8 kernel builds to time side by side (e.g. amx,vnni on an AMX CPU); default: this CPU's own")
    ap.add_argument("--peers", default="hf,llama.cpp", help="peers timed on the same file: hf, llama.cpp (where "
                    "installed) or none")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = tuple(int(r) for r in args.rows.split(","))
    assert rows[0] == 1 and len(rows) > 1, "--rows starts at 1 and has a larger size"
    machine = cpu()
    if not kernels.available():
        raise SystemExit("int8 activations need the block kernels (no compiler or no AVX2 here)")
    builds = [b for b in args.int8_builds.split(",") if b] or [kernels.ext().q8_kernel_build()]
    t = {"fp32": curve(args.model, "fp32", args.repeats, rows)}
    t.update({f"int8 {b}": int8_curve(args.model, b, args.repeats, rows) for b in builds})
    peers = [p for p in args.peers.split(",") if p and p != "none"]
    path = resolve_model_path(args.model)
    if "llama.cpp" in peers:
        c = llama_cpp_pass_curve(path, args.threads, rows, repeats=args.repeats) if llama_cpp_available() else None
        if c is None:
            print("llama.cpp: not installed (make llamacpp) or its run failed; left out", file=sys.stderr)
        else:
            t["llama.cpp"] = c
    if "hf" in peers:
        try:
            t["HF fp32"] = hf_curve(path, args.repeats, rows)
        except Exception as e:  # a peer's failure must not take the engine's figures with it
            print(f"HF transformers: its run failed ({type(e).__name__}: {str(e)[:200]}); left out", file=sys.stderr)
    modes, top = list(t), rows[-1]
    int8 = modes[1:]  # the int8 builds and the peers, each put beside the fp32 mode
    extra = {m: (c[top] - c[1]) / (top - 1) for m, c in t.items()}  # seconds per further row
    cmd = f"python bench/row_cost.py --model {args.model} --threads {args.threads} --rows {args.rows}"
    if args.int8_builds:
        cmd += f" --int8-builds {args.int8_builds}"
    if args.peers != "hf,llama.cpp":
        cmd += f" --peers {args.peers}"
    lines = [f"# A further row's cost by activation mode: {args.model}", "",
             f"CPU: {machine['cpu']}; {', '.join(machine['flags'])}; {args.threads} threads. "
             f"`{cmd}`: bare target passes, the fastest of {args.repeats} start-up calibrations each; peers "
             f"on the same file after the same 128 tokens of context, logits at every row (the fastest of "
             f"{args.repeats}).", "",
             "| rows | " + " | ".join(f"{m} ms" for m in modes) + " | " + " | ".join(f"fp32 / {m}" for m in int8) + " |",
             "|---|" + "---|" * (len(modes) + len(int8))]
    lines += [f"| {n} | " + " | ".join(f"{1e3 * t[m][n]:.1f}" for m in modes) + " | "
              + " | ".join(f"{t['fp32'][n] / t[m][n]:.2f}x" for m in int8) + " |" for n in rows]
    lines += ["", "| | " + " | ".join(modes) + " | " + " | ".join(f"fp32 / {m}" for m in int8) + " |",
              "|---|" + "---|" * (len(modes) + len(int8)),
              f"| a further row, ms (({top} rows - 1 row) / {top - 1}) | " + " | ".join(f"{1e3 * extra[m]:.2f}" for m in modes)
              + " | " + " | ".join(f"**{extra['fp32'] / extra[m]:.2f}x**" for m in int8) + " |",
              "| a further row / a one-row pass | " + " | ".join(f"{extra[m] / t[m][1]:.3f}" for m in modes)
              + " |" + " |" * len(int8)]
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, "row-cost-" + time.strftime("%Y%m%d-%H%M%S"))
    with open(stem + ".json", "w") as f:
        json.dump({"model": args.model, "machine": machine, "threads": args.threads, "rows": rows,
                   "seconds": {m: {str(n): s for n, s in c.items()} for m, c in t.items()},
                   "extra_row_seconds": extra}, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\nwritten to {stem}.{{md,json}}")


if __name__ == "__main__":
    main()
