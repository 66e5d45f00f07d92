"""Where a batch-1 decode step's time goes: block matmuls (timed alone, same shapes) vs the rest.

Run: .venv/bin/python bench/profile_decode.py [--model NAME|PATH] [--batch 1] [--steps 64]
The block kernels are pybind calls the torch profiler cannot see, so their share is measured by
replaying the step's matmuls in isolation and subtracting from the measured step time."""
import argparse
import time

import torch

from specserve import LLM, SamplingParams
from specserve.config import ACTIVATIONS
from specserve_bench.humaneval import humaneval_prompts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--model", default=None, help="a known model's name or a path (default: the embedded model)")
    ap.add_argument("--activations", default="fp32", choices=ACTIVATIONS, help="the block kernels' activations")
    args = ap.parse_args()
    llm = LLM(args.model, kv_cache_gib=0.25, activations=args.activations)
    prompt = humaneval_prompts(1)[0]
    params = SamplingParams(n=args.batch, temperature=0 if args.batch == 1 else 0.7, seed=0, max_tokens=args.steps,
                            ignore_eos=True)
    llm.generate(prompt, params)
    out = llm.generate(prompt, params)[0]
    step_ms = out.metrics["per_token_latency"] * 1e3

    model = llm.engine.model
    lins = [lin for layer in model.layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    x = {k: torch.randn(args.batch, k) for k in {lin.block.shape[1] for lin in lins + [model.lm_head]}}
    def replay(ls):
        for _ in range(3):
            for lin in ls:
                lin(x[lin.block.shape[1]])
        t0 = time.perf_counter()
        for _ in range(10):
            for lin in ls:
                lin(x[lin.block.shape[1]])
        return (time.perf_counter() - t0) / 10 * 1e3
    layers_ms, head_ms = replay(lins), replay([model.lm_head])
    rest = step_ms - layers_ms - head_ms
    print(f"batch {args.batch}: decode step {step_ms:.1f} ms = block matmuls in layers {layers_ms:.1f} ms "
          f"({layers_ms / step_ms:.0%}) + LM head {head_ms:.1f} ms ({head_ms / step_ms:.0%}) "
          f"+ attention, norms, RoPE, sampling, Python {rest:.1f} ms ({rest / step_ms:.0%})")
    nbytes = model.weight_bytes
    print(f"weights read per step: {nbytes / 1e6:.0f} MB -> {nbytes / (layers_ms + head_ms) / 1e6:.1f} GB/s "
          f"effective in the matmuls")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        llm.generate(prompt, SamplingParams(n=args.batch, temperature=params.temperature, seed=0, max_tokens=16,
                                            ignore_eos=True))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
