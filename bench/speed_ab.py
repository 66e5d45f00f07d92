"""EAGLE drafts (or drafting methods) side by side by speed: batch-1 tokens/s against regular decoding
(RD), on the bench's prompts beyond code and on HumanEval, fallback on, shape auto, RD and each
configuration interleaved prompt by prompt (bench.spec._compare). Timings move with the machine;
bench/draft_ab.py gives the counts, which do not.

  python bench/speed_ab.py OLD_DRAFT_DIR NEW_DRAFT_DIR [--beyond-code 20] [--humaneval 16] [--json OUT]
  python bench/speed_ab.py --methods draft,lookup+draft,suffix,suffix+draft     # the shipped draft
  python bench/speed_ab.py --methods lookahead --forced      # also with fallback off (every step drafts)
"""
import argparse
import json

from tqdm import tqdm

from specserve import LLM, SamplingParams
from specserve_bench.humaneval import humaneval_problems
from specserve_bench.spec import _compare
from specserve_bench.spec_shapes import prompt_sets

p = argparse.ArgumentParser()
p.add_argument("drafts", nargs="*", default=[None], help="draft dirs (default: the shipped draft)")
p.add_argument("--methods", default="draft,lookup+draft")
p.add_argument("--beyond-code", type=int, default=20)
p.add_argument("--humaneval", type=int, default=16)
p.add_argument("--forced", action="store_true", help="each method also with fallback off")
p.add_argument("--json", default=None)
args = p.parse_args()
rd = LLM(kv_cache_gib=1.0, max_num_seqs=16)
sets = prompt_sets(rd, humaneval_problems(), 8)
params = SamplingParams(temperature=0, max_tokens=128)
out = {}
for set_name, n in (("beyond code", args.beyond_code), ("humaneval", args.humaneval)):
    for method in args.methods.split(","):
        for d in args.drafts:
            for fallback in (True, False) if args.forced else (True,):
                spec = dict(method=method, draft_model=d, shape="auto", fallback=fallback)
                llm = LLM(kv_cache_gib=1.0, max_num_seqs=16, speculative=spec)
                llm.generate("Hello", SamplingParams(temperature=0, max_tokens=8))  # warm up; not a bench prompt (suffix caches outputs)
                t = _compare(rd, llm, sets[set_name][:n], 1, n, params, tqdm(disable=True))
                name = method + ("" if fallback else " (forced)")
                print(f"{set_name:12s} {name:13s} {d}  {t['speedup']['tokens_per_s']}x {t['speedup_95ci']['tokens_per_s']} "
                      f"tokens/step {t['tokens_per_target_step']} identical {t['identical_to_rd']}", flush=True)
                out[f"{set_name} | {name} | {d}"] = {k: t[k] for k in ("speedup", "speedup_95ci", "tokens_per_target_step",
                                                                      "identical_to_rd")}
                del llm
if args.json:
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
