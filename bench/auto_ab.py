"""The engine's automatic choice against regular decoding (RD) at batch 1-16, the issue's "never more
than 5% slower": greedy, 128 new tokens, HumanEval prompts and the bench's prompts beyond code
(through the chat template), RD and each configuration taking turns batch by batch
(bench.spec._compare), the tok/s ratio with its 95% interval over rounds.

  python bench/auto_ab.py [--methods auto,draft] [--batches 1,2,4,8,16] [--sequences 40]

Fresh engines for every batch size: the suffix drafter remembers earlier requests' outputs and both
engines' prefix caches remember their prompts, so a prompt seen at an earlier batch size would be
answered from memory (suffix+draft ran 1.5x at batch 2 on the prompts beyond code that way). Writes
bench/results/auto-ab-<time>.md.
"""
import argparse
import time

from tqdm import tqdm

from specserve import LLM, SamplingParams
from specserve_bench.humaneval import humaneval_problems
from specserve_bench.machine import cpu
from specserve_bench.spec import _compare
from specserve_bench.spec_shapes import WITHIN, prompt_sets

p = argparse.ArgumentParser()
p.add_argument("--methods", default="auto,draft")
p.add_argument("--batches", default="1,2,4,8,16")
p.add_argument("--sets", default="beyond code,humaneval")
p.add_argument("--sequences", type=int, default=40, help="per batch size (rounds = sequences / batch, at least 3)")
p.add_argument("--out", default="bench/results")
p.add_argument("--model", default=None, help="default: the embedded model")
p.add_argument("--draft-model", default=None, help="the draft model of the methods that use one (default: the shipped draft)")
p.add_argument("--activations", default="fp32", choices=["fp32", "int8"])
p.add_argument("--draft-vocab", type=int, default=0, help="the draft model's head over this many tokens (0: all)")
p.add_argument("--draft-quant", default="none", help="the draft model's wider weights re-encoded as this GGML type")
p.add_argument("--repetition-penalty", type=float, default=1.0, help="every request's (1: off; ollama's default is 1.1)")
p.add_argument("--presence-penalty", type=float, default=0.0)
p.add_argument("--frequency-penalty", type=float, default=0.0)
args = p.parse_args()
penalties = dict(repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
                 frequency_penalty=args.frequency_penalty)
penalty_flags = "".join(f" --{k.replace('_', '-')} {v}" for k, v in penalties.items() if v != getattr(SamplingParams(), k))
common = dict(kv_cache_gib=1.0, max_num_seqs=16, activations=args.activations)
if args.model:
    common["model"] = args.model
spec_extra = {"draft_model": args.draft_model} if args.draft_model else {}
if args.draft_vocab or args.draft_quant != "none":
    spec_extra.update(draft_vocab=args.draft_vocab, draft_quant=args.draft_quant)
params = SamplingParams(temperature=0, max_tokens=128, **penalties)
machine = cpu()
lines = [f"# The automatic choice vs regular decoding, batch 1-16 ({machine['cpu']}, {', '.join(machine['flags'])})", "",
         f"`python bench/auto_ab.py --methods {args.methods} --batches {args.batches} --sequences {args.sequences} "
         f"--sets '{args.sets}'" + (f" --model {args.model}" if args.model else "")
         + (f" --draft-model {args.draft_model}" if args.draft_model else "")
         + (f" --draft-vocab {args.draft_vocab}" if args.draft_vocab else "")
         + (f" --draft-quant {args.draft_quant}" if args.draft_quant != "none" else "") + penalty_flags
         + f" --activations {args.activations}`: greedy{' with those penalties' if penalty_flags else ''}, "
         "128 new tokens, fresh engines per batch size, RD and speculation taking turns batch by batch; "
         f"tok/s ratio with its 95% interval over rounds; below {WITHIN} flagged.", "",
         "| method | prompts | batch | RD tok/s | spec tok/s | ratio | 95% interval | tokens/step | plain / drafting steps | identical |",
         "|---|---|---|---|---|---|---|---|---|---|"]
sets = None
for set_name in args.sets.split(","):
    for method in args.methods.split(","):
        for b in (int(x) for x in args.batches.split(",")):
            rd = LLM(**common)
            spec = LLM(**common, speculative=dict(method=method, **spec_extra))
            sets = sets or prompt_sets(rd, humaneval_problems(), 8)
            for llm in (rd, spec):  # warm up on a prompt outside the bench's
                llm.generate("Hello", SamplingParams(temperature=0, max_tokens=8))
            spec.reset_spec_stats()
            rounds = max(3, args.sequences // b)
            t = _compare(rd, spec, sets[set_name], b, rounds, params, tqdm(disable=True))
            ratio = t["speedup"]["tokens_per_s"]
            lines.append(f"| {method} | {set_name} | {b} | {t['rd']['tokens_per_s']} | {t['spec']['tokens_per_s']} | "
                         f"{ratio}x{'' if ratio >= WITHIN else ' BELOW'} | {t['speedup_95ci']['tokens_per_s']} | "
                         f"{t['tokens_per_target_step']} | {t['fallback_steps']} / {t['spec_steps']} | {t['identical_to_rd']} |")
            print(lines[-1], flush=True)
            del rd, spec
path = f"{args.out}/auto-ab-{time.strftime('%Y%m%d-%H%M%S')}.md"
with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
print("written", path)
