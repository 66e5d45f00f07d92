"""Two EAGLE drafts side by side on held-out HumanEval problems, by tokens per target step.

Fixed draft length and no fallback, so the counts do not depend on this machine's timing noise:

  python bench/draft_ab.py OLD_DRAFT_DIR NEW_DRAFT_DIR [--problems 12:40] [--k 3] [--max-tokens 96]
"""
import argparse

from specserve import LLM, SamplingParams
from specserve.bench.humaneval import humaneval_prompts

p = argparse.ArgumentParser()
p.add_argument("drafts", nargs="+")
p.add_argument("--problems", default="12:40")
p.add_argument("--k", type=int, default=3)
p.add_argument("--max-tokens", type=int, default=96)
args = p.parse_args()
lo, hi = (int(x) for x in args.problems.split(":"))
prompts = humaneval_prompts(hi)[lo:]
for d in args.drafts:
    for method in ("draft", "lookup+draft"):
        llm = LLM(speculative={"method": method, "draft_model": d, "policy": "fixed", "draft_len": args.k, "fallback": False},
                  max_num_seqs=8)
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=args.max_tokens), use_tqdm=False)
        steps = sum(len(o.outputs[0].accepted_per_step) for o in outs)
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        print(f"{d}  {method:13s} tokens per target step {tokens / steps:.3f}  alpha {llm.spec_stats()['alpha']:.3f}", flush=True)
