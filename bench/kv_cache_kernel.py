"""The paged attention kernel alone over an f32 and an f16 KV cache, side by side in one run
(--kv-cache-dtype float16): a decode row and a 16-row prompt chunk at a long context, with every
layer's cache of the model so that the keys come from DRAM, as in a decode step, and blocks in random
order. Heads of Qwen2.5-Coder-0.5B (14 / 2, head size 64, 24 layers) and 1.5B (12 / 2, 128, 28).
Random values: the time does not depend on them.

    python bench/kv_cache_kernel.py [--contexts 2000,6000] [--repeats 8]

Writes bench/results/kv-cache-kernel-<time>.md / .json (the fastest of the repeats, f32 and f16
alternating).
"""
import argparse
import sys
import time
from pathlib import Path

import torch

from specserve import kernels

sys.path.insert(0, str(Path(__file__).parent))
from specserve_bench.machine import cpu  # noqa: E402
from specserve_bench.output import write_results  # noqa: E402

SHAPES = {"qwen2.5-coder-0.5b": (14, 2, 64, 24), "qwen2.5-coder-1.5b": (12, 2, 128, 28)}  # H, Hkv, D, layers
BLOCK = 16


def time_pass(shape, kv: int, q_len: int, repeats: int) -> dict:
    """Fastest of `repeats` passes over all layers, f32 and f16 caches alternating, in ms."""
    H, Hkv, D, layers = shape
    nb = kv // BLOCK + 1
    c32 = [(torch.randn(nb * BLOCK, Hkv, D), torch.randn(nb * BLOCK, Hkv, D)) for _ in range(layers)]
    caches = {"f32": c32, "f16": [(k.half(), v.half()) for k, v in c32]}
    q = torch.randn(q_len, H, D)
    ids = lambda *x: torch.tensor(x, dtype=torch.long)  # noqa: E731
    table = torch.tensor([torch.randperm(nb).tolist()])
    ext = kernels.ext()
    best = {name: float("inf") for name in caches}
    for _ in range(repeats):
        for name, layer_caches in caches.items():
            t0 = time.perf_counter()
            for k, v in layer_caches:
                ext.paged_attention(q, k, v, table, ids(0), ids(q_len), ids(kv), BLOCK, D ** -0.5, None, None, 0)
            best[name] = min(best[name], (time.perf_counter() - t0) * 1e3)
    return best


def markdown(r: dict) -> str:
    c = r["cpu"]
    lines = ["# The paged attention kernel: f32 against f16 KV cache", "",
             f"CPU: {c['cpu']} ({', '.join(c['flags'])}), {r['threads']} threads; fastest of {r['repeats']}; "
             "every layer's cache, blocks in random order.", "",
             "| heads of | context | query rows | f32 cache ms (all layers) | f16 cache ms | f16 speed-up |",
             "|---|---|---|---|---|---|"]
    for row in r["rows"]:
        lines.append(f"| {row['model']} | {row['kv']} | {row['q_len']} | {row['f32']:.1f} | {row['f16']:.1f} "
                     f"| {row['f32'] / row['f16']:.2f}x |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="2000,6000")
    ap.add_argument("--repeats", type=int, default=8)
    args = ap.parse_args()
    if not kernels.available():
        sys.exit("the CPU kernels are not available (no compiler?)")
    r = {"cpu": cpu(), "threads": torch.get_num_threads(), "repeats": args.repeats, "rows": []}
    for model, shape in SHAPES.items():
        for kv in (int(n) for n in args.contexts.split(",")):
            for q_len in (1, 16):
                best = time_pass(shape, kv, q_len, args.repeats)
                r["rows"].append({"model": model, "kv": kv, "q_len": q_len, **best})
                print(r["rows"][-1], flush=True)
    write_results(r, str(Path(__file__).parent / "results"), "kv-cache-kernel", markdown, lambda r, p: None)


if __name__ == "__main__":
    main()
