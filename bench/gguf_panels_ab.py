"""The fp32 GGUF kernel's panels (gguf_matmul.cpp's columns_panels, passes of 16+ rows) against whole
columns, side by side in one process on one loaded model: each projection of one layer at several row
counts, then a prompt's prefill, the two alternated rep by rep (the switch is ext.gguf_kernel_panels),
and their outputs compared (they must be the same bits: same sums, same order). AVX2 build only (the
AVX-512 build has no panels; it is switched off here where the CPU has it).

    python bench/gguf_panels_ab.py [--model qwen2.5-coder-1.5b] [--rows 8,16,64,256] [--prompt 1024] [--reps 5]

Writes bench/results/gguf-panels-<time>.md / .json.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from specserve import LLM, SamplingParams, kernels
from specserve.loading import resolve_model_path

sys.path.insert(0, str(Path(__file__).parent))
from specserve_bench.machine import cpu  # noqa: E402
from specserve_bench.output import write_results  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--model", default="qwen2.5-coder-1.5b")
ap.add_argument("--rows", default="8,16,64,256")
ap.add_argument("--prompt", type=int, default=1024, help="prompt tokens of the prefill timed (0: none)")
ap.add_argument("--layer", type=int, default=3)
ap.add_argument("--reps", type=int, default=5)
args = ap.parse_args()

if not kernels.available():
    sys.exit("no compiled CPU kernels here (a compiler and AVX2 are needed)")
ext = kernels.ext()
avx512 = ext.block_kernel_avx512()
ext.block_kernel_avx512(False)
llm = LLM(resolve_model_path(args.model), kv_cache_gib=0.5, enable_prefix_caching=False)
layer = llm.engine.model.layers[args.layer]


def ab(fn):
    """{"panels": best s, "whole": best s}, the two alternated; and whether their outputs are equal."""
    best, out = {"panels": float("inf"), "whole": float("inf")}, {}
    for _ in range(args.reps):
        for mode in best:
            ext.gguf_kernel_panels(mode == "panels")
            fn()  # warm: the first call after a switch settles the caches for this order
            t = time.perf_counter()
            out[mode] = fn()
            best[mode] = min(best[mode], time.perf_counter() - t)
    ext.gguf_kernel_panels(True)
    return best, torch.equal(out["panels"], out["whole"]) if isinstance(out["panels"], torch.Tensor) else out["panels"] == out["whole"]


rows = []
for name in ("qkv", "o", "gate_up", "down"):
    w = getattr(layer, name).block
    N, K = w.shape
    for m in (int(r) for r in args.rows.split(",")):
        x = torch.randn(m, K)
        best, same = ab(lambda w=w, x=x: w.matmul(x))
        rows.append({"projection": name, "N": N, "K": K, "rows": m, "same_bits": same,
                     **{f"{k}_gmacs": m * N * K / v / 1e9 for k, v in best.items()}, "speedup": best["whole"] / best["panels"]})
prefill = None
if args.prompt:
    vocab = llm.engine.arch.vocab_size
    ids = [(1000 + 37 * i) % (vocab - 200) + 100 for i in range(args.prompt)]
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    best, same = ab(lambda: llm.generate([ids], sp)[0].outputs[0].token_ids)
    prefill = {"tokens": args.prompt, "prefill_chunk": llm.engine.prefill_chunk, "same_tokens": same,
               **{f"{k}_tok_s": args.prompt / v for k, v in best.items()}, "speedup": best["whole"] / best["panels"]}
ext.block_kernel_avx512(avx512)


def markdown(r: dict) -> str:
    lines = [f"# GGUF fp32 kernel: panels vs whole columns ({r['model']}, layer {r['layer']})", "",
             f"CPU: {r['cpu']['cpu']} ({', '.join(r['cpu']['flags'])}), {torch.get_num_threads()} threads, "
             f"best of {r['reps']} alternated reps", "",
             "| projection | N x K | rows | whole GMAC/s | panels GMAC/s | speedup | same bits |", "|---|---|---|---|---|---|---|"]
    for x in r["rows"]:
        lines.append(f"| {x['projection']} | {x['N']} x {x['K']} | {x['rows']} | {x['whole_gmacs']:.1f} | "
                     f"{x['panels_gmacs']:.1f} | {x['speedup']:.2f}x | {x['same_bits']} |")
    p = r["prefill"]
    if p:
        lines += ["", f"Prefill of {p['tokens']} tokens (+8 decoded; chunk {p['prefill_chunk']}): whole {p['whole_tok_s']:.1f} "
                      f"tok/s, panels {p['panels_tok_s']:.1f} tok/s ({p['speedup']:.2f}x), same tokens: {p['same_tokens']}",
                  f"Geometric mean of the projections' speedups at 16+ rows: {r['geomean_16plus']:.2f}x"]
    return "\n".join(lines) + "\n"


big = [x["speedup"] for x in rows if x["rows"] >= 16]
result = {"model": args.model, "layer": args.layer, "reps": args.reps, "cpu": cpu(), "rows": rows, "prefill": prefill,
          "geomean_16plus": statistics.geometric_mean(big) if big else None}
write_results(result, str(Path(__file__).parent / "results"), "gguf-panels", markdown, lambda r, path: None)
