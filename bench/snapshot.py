"""Token ids of a fixed set of generations, to diff two commits for "no change in behaviour".

    python bench/snapshot.py OUT.json [--prompts 16] [--max-tokens 48]
    python bench/snapshot.py --diff A.json B.json

Covers regular decoding and every registered speculative method (greedy, fallback on and off,
chains and trees), batch 1 and 8,
on HumanEval prompts, plus seeded sampling (n = 2) with and without speculation. Greedy and seeded
outputs must be identical across commits that claim no behaviour change.
"""
from __future__ import annotations

import argparse
import json
import sys

from specserve import LLM, SamplingParams
from specserve_bench.humaneval import humaneval_prompts

CONFIGS = {
    "rd": None,
    "draft": {"method": "draft"},
    "draft-nofallback": {"method": "draft", "fallback": False},
    "draft-fixed3-pad": {"method": "draft", "policy": "fixed", "draft_len": 3, "attention": "pad"},
    "draft-threshold": {"method": "draft", "policy": "threshold", "fallback": False},
    "lookup": {"method": "lookup"},
    "lookup+draft": {"method": "lookup+draft"},
    "lookup+draft-nofallback": {"method": "lookup+draft", "fallback": False},
    "draft-tree-nofallback": {"method": "draft", "shape": "tree", "fallback": False},
    "draft-auto-shape": {"method": "draft", "shape": "auto"},
    "ngram-nofallback": {"method": "ngram", "fallback": False},
    "suffix": {"method": "suffix"},
    "suffix-nofallback": {"method": "suffix", "fallback": False},
    "suffix+draft-tree": {"method": "suffix+draft", "shape": "tree", "fallback": False},
    "auto": {"method": "auto"},
    "lookahead-nofallback": {"method": "lookahead", "fallback": False},
    "staged-target-lookup": {"method": "staged", "stages": ["target", "lookup"], "fallback": False},
}


def snapshot(num_prompts: int, max_tokens: int) -> dict:
    prompts = humaneval_prompts(num_prompts)
    greedy = SamplingParams(temperature=0, max_tokens=max_tokens)
    seeded = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=max_tokens, seed=1234, n=2)
    out = {}
    for name, spec in CONFIGS.items():
        llm = LLM(speculative=spec, kv_cache_gib=0.25, max_num_seqs=8)
        ids = lambda outs: [[o.token_ids for o in r.outputs] for r in outs]
        out[name] = {
            "greedy_b1": [ids(llm.generate(p, greedy))[0] for p in prompts[:4]],
            "greedy_b8": ids(llm.generate(prompts, greedy)),
            "seeded_b8": ids(llm.generate(prompts[:8], seeded)),
        }
        print(name, "done", file=sys.stderr, flush=True)
    return out


def diff(a: dict, b: dict) -> int:
    bad = 0
    for name in sorted(set(a) | set(b)):
        for cell in sorted(set(a.get(name, {})) | set(b.get(name, {}))):
            x, y = a.get(name, {}).get(cell), b.get(name, {}).get(cell)
            same = x == y
            bad += not same
            print(f"{name:26s} {cell:10s} {'identical' if same else 'DIFFERENT'}")
    print(f"{bad} cell(s) differ")
    return bad


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--diff", nargs=2, metavar=("A", "B"))
    args = ap.parse_args()
    if args.diff:
        a, b = (json.load(open(p)) for p in args.diff)
        sys.exit(1 if diff(a, b) else 0)
    with open(args.out, "w") as f:
        json.dump(snapshot(args.prompts, args.max_tokens), f)


if __name__ == "__main__":
    main()
