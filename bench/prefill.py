"""Prefill rate of one long prompt, side by side in one run on the same GGUF: specserve with fp32 and
with int8 activations (its automatic prefill chunk, prefix caching off), llama.cpp (its own batching,
in a child process, without extra buffer types where those crash) and HF transformers fp32 where asked.
Each is the fastest of --reps prefills of the same ids (specserve: one token generated, so the time is
the prompt's passes and one LM-head row).

    python bench/prefill.py [--model qwen2.5-coder-1.5b] [--tokens 1024] [--reps 2] [--hf]

Writes bench/results/prefill-<time>.md / .json.
"""
import argparse
import os
import sys
import time
from pathlib import Path

import torch

from specserve import LLM, SamplingParams
from specserve.loading import resolve_model_path

sys.path.insert(0, str(Path(__file__).parent))
from specserve_bench import peers  # noqa: E402
from specserve_bench.machine import cpu  # noqa: E402
from specserve_bench.output import write_results  # noqa: E402


def markdown(r: dict) -> str:
    lines = [f"# Prefill of {r['tokens']} tokens: {os.path.basename(r['model'])}", "",
             f"CPU: {r['cpu']['cpu']} ({', '.join(r['cpu']['flags'])}), {r['threads']} threads, best of {r['reps']}", "",
             "| system | seconds | tokens/s | vs llama.cpp |", "|---|---|---|---|"]
    ref = r["systems"].get("llama.cpp", {}).get("tokens_per_s")
    for name, v in r["systems"].items():
        chunk = f" (chunk {v['prefill_chunk']})" if "prefill_chunk" in v else ""
        lines.append(f"| {name}{chunk} | {v['s']:.2f} | {v['tokens_per_s']:.1f} | "
                     f"{v['tokens_per_s'] / ref:.2f}x |" if ref else f"| {name}{chunk} | {v['s']:.2f} | {v['tokens_per_s']:.1f} | - |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--hf", action="store_true", help="HF transformers fp32 too (slow: a dense fp32 copy of the model)")
    args = ap.parse_args()

    path = resolve_model_path(args.model)
    threads = torch.get_num_threads()
    systems = {}
    vocab = None
    for act in ("fp32", "int8"):
        llm = LLM(path, kv_cache_gib=0.5, enable_prefix_caching=False, activations=act)
        vocab = llm.engine.arch.vocab_size
        ids = [(1000 + 37 * i) % (vocab - 200) + 100 for i in range(args.tokens)]
        sp = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
        llm.generate([ids[:32]], sp)  # warm-up
        best = float("inf")
        for _ in range(args.reps):
            t0 = time.perf_counter()
            llm.generate([ids], sp)
            best = min(best, time.perf_counter() - t0)
        systems[f"specserve {act}"] = {"s": best, "prefill_chunk": llm.engine.prefill_chunk}
        del llm
    if peers.llama_cpp_available():
        s = peers.llama_cpp_prefill(path, threads, ids, args.reps)
        if s is not None:
            systems["llama.cpp"] = {"s": s}
    if args.hf:
        model = peers.load_hf(path, torch.float32)
        with torch.inference_mode():
            x = torch.tensor([ids])
            best = float("inf")
            for _ in range(args.reps):
                t0 = time.perf_counter()
                model(x, use_cache=False, logits_to_keep=1)
                best = min(best, time.perf_counter() - t0)
        systems["HF fp32"] = {"s": best}
    for v in systems.values():
        v["tokens_per_s"] = args.tokens / v["s"]


    write_results({"model": path, "tokens": args.tokens, "reps": args.reps, "threads": threads, "cpu": cpu(), "systems": systems},
                  str(Path(__file__).parent / "results"), "prefill", markdown, lambda r, p: None)


if __name__ == "__main__":  # llama.cpp runs in a spawned child, which imports this file
    main()
