"""Forced configurations against regular decoding on the cells where `specserve bench spec` found them
below 0.95x (bench/results/spec-cpu-20261124-072437.md), re-measured after a change:

  python bench/forced_ab.py [--batches 4,8,16] [--rounds 4]

Greedy, 128 new tokens, RD and the configuration taking turns batch by batch (bench.spec._compare),
the tok/s ratio with its 95% interval over rounds."""
import argparse

from tqdm import tqdm

from specserve import LLM, SamplingParams
from specserve_bench.humaneval import humaneval_problems
from specserve_bench.spec import _compare
from specserve_bench.spec_shapes import prompt_sets

CELLS = [("lookup", dict(method="lookup"), "beyond code"),
         ("lookup+draft auto", dict(method="lookup+draft", shape="auto"), "beyond code"),
         ("draft, attention pad", dict(method="draft", attention="pad"), "humaneval")]

p = argparse.ArgumentParser()
p.add_argument("--batches", default="4,8,16")
p.add_argument("--rounds", type=int, default=4)
args = p.parse_args()
common = dict(kv_cache_gib=1.0, max_num_seqs=16)
rd = LLM(**common)
sets = prompt_sets(rd, humaneval_problems(), 8)
params = SamplingParams(temperature=0, max_tokens=128)
print("| config | prompts | batch | tok/s ratio | 95% interval | tokens/step | plain / drafting steps |\n|---|---|---|---|---|---|---|")
for name, cfg, set_name in CELLS:
    llm = LLM(**common, speculative=cfg)
    llm.generate(sets[set_name][0]["prompt"], SamplingParams(temperature=0, max_tokens=8))
    for b in (int(x) for x in args.batches.split(",")):
        t = _compare(rd, llm, sets[set_name], b, args.rounds, params, tqdm(disable=True))
        print(f"| {name} | {set_name} | {b} | {t['speedup']['tokens_per_s']}x | {t['speedup_95ci']['tokens_per_s']} "
              f"| {t['tokens_per_target_step']} | {t['fallback_steps']} / {t['spec_steps']} |", flush=True)
    del llm
