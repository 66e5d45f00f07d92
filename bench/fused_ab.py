"""Each decoder layer as one C++ call (models/decoder.py's fused path) against the op-by-op reference,
side by side in one process: decode ms/token at batch 1 and 8, the two paths alternated rep by rep on
the same loaded model, and their greedy tokens compared (they must be identical: same kernels, same order).

    python bench/fused_ab.py [--models gemma-3-270m,qwen2.5-coder-0.5b] [--activations fp32,int8]
                             [--batches 1,8] [--tokens 96] [--reps 5]

Writes bench/results/fused-ab-<time>.md.
"""
import argparse
import statistics
import time
from pathlib import Path

from specserve import LLM, SamplingParams, system_info
from specserve.sysinfo import summary_line
from specserve_bench.humaneval import humaneval_prompts

ap = argparse.ArgumentParser()
ap.add_argument("--models", default="gemma-3-270m,qwen2.5-coder-0.5b")
ap.add_argument("--activations", default="fp32,int8")
ap.add_argument("--batches", default="1,8")
ap.add_argument("--tokens", type=int, default=96)
ap.add_argument("--reps", type=int, default=5)
args = ap.parse_args()

batches = [int(b) for b in args.batches.split(",")]
prompts = humaneval_prompts(max(batches))
sp = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
rows = []
for name in args.models.split(","):
    for act in args.activations.split(","):
        llm = LLM(name, activations=act, kv_cache_gib=0.5, max_num_seqs=max(batches))
        model = llm.engine.model
        fused_layers = model.fused_layers
        assert fused_layers is not None, f"{name} ({act}) has no fused layers"
        for b in batches:
            ms = {"fused": [], "op by op": []}
            tokens = {}
            llm.generate(prompts[:b], sp)  # warm up
            for _ in range(args.reps):
                for path in ms:
                    model.fused_layers = fused_layers if path == "fused" else None
                    outs = llm.generate(prompts[:b], sp)
                    # decode only: each request's own per-token latency (TTFT excluded), averaged over the batch
                    ms[path].append(statistics.mean(o.metrics["per_token_latency"] for o in outs) * 1e3)
                    tokens[path] = [o.outputs[0].token_ids for o in outs]
            model.fused_layers = fused_layers
            same = tokens["fused"] == tokens["op by op"]
            f, r = statistics.median(ms["fused"]), statistics.median(ms["op by op"])
            rows.append((name, act, b, f, min(ms["fused"]), r, min(ms["op by op"]), r / f, same))
            print(f"{name} {act} batch {b}: fused {f:.2f} ms/token, op by op {r:.2f} ({r / f:.2f}x), "
                  f"tokens identical: {same}", flush=True)
        del llm

stamp = time.strftime("%Y%m%d-%H%M%S")
out = Path(__file__).parent / "results" / f"fused-ab-{stamp}.md"
lines = [f"# The fused decoder layer against the op-by-op reference ({summary_line(system_info())})", "",
         f"`python bench/fused_ab.py --models {args.models} --activations {args.activations} --batches {args.batches} "
         f"--tokens {args.tokens} --reps {args.reps}`: greedy, HumanEval prompts, EOS ignored; per-token decode "
         "latency (TTFT excluded), the two paths alternated rep by rep on one loaded model.", "",
         "| model | activations | batch | fused ms/token (median / min) | op by op (median / min) | speedup | tokens identical |",
         "|---|---|---|---|---|---|---|"]
for name, act, b, f, fmin, r, rmin, x, same in rows:
    lines.append(f"| {name} | {act} | {b} | {f:.2f} / {fmin:.2f} | {r:.2f} / {rmin:.2f} | {x:.2f}x | {same} |")
out.write_text("\n".join(lines) + "\n")
print(f"wrote {out}")
