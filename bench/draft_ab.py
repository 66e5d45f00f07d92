"""EAGLE drafts side by side, by counts: tokens per target step, acceptance, and first-token acceptance,
on held-out HumanEval problems and per category on the bench's prompts beyond code (bench/prompts.py,
through the chat template; never trained on).

Fixed draft length and no fallback, greedy, so the counts do not depend on this machine's timing noise
(a run under load counts the same):

  python bench/draft_ab.py OLD_DRAFT_DIR NEW_DRAFT_DIR [--problems 12:40] [--k 3] [--max-tokens 96]
      [--sets humaneval,beyond-code] [--json OUT.json]
"""
import argparse
import json

from specserve import LLM, SamplingParams
from specserve_bench.humaneval import humaneval_prompts
from specserve_bench.spec_shapes import prompt_sets

p = argparse.ArgumentParser()
p.add_argument("drafts", nargs="+")
p.add_argument("--problems", default="12:40")
p.add_argument("--k", type=int, default=3)
p.add_argument("--max-tokens", type=int, default=96)
p.add_argument("--methods", default="draft,lookup+draft")
p.add_argument("--sets", default="humaneval,beyond-code")
p.add_argument("--json", default=None, help="write the counts here")
args = p.parse_args()
lo, hi = (int(x) for x in args.problems.split(":"))


def counts(outs) -> dict:
    acc = [a for o in outs for a in o.outputs[0].accepted_per_step]
    dra = [d for o in outs for d in o.outputs[0].drafted_per_step]
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    drafting = [(a, d) for a, d in zip(acc, dra) if d]
    return {"tokens_per_target_step": round(tokens / len(acc), 3), "acceptance": round(sum(acc) / max(1, sum(dra)), 3),
            "first_token_acceptance": round(sum(a > 0 for a, _ in drafting) / max(1, len(drafting)), 3),
            "verify_steps": len(acc), "tokens": tokens}


results: dict = {}
for d in args.drafts:
    for method in args.methods.split(","):
        llm = LLM(speculative={"method": method, "draft_model": d, "policy": "fixed", "draft_len": args.k, "fallback": False},
                  max_num_seqs=8)
        sets = {}
        if "humaneval" in args.sets:
            sets["humaneval"] = [("code", x) for x in humaneval_prompts(hi)[lo:]]
        if "beyond-code" in args.sets:
            sets["beyond code"] = [(x["category"], x["prompt"]) for x in prompt_sets(llm, [], 8)["beyond code"]]
        for set_name, prompts in sets.items():
            outs = llm.generate([x for _, x in prompts], SamplingParams(temperature=0, max_tokens=args.max_tokens), use_tqdm=False)
            by_cat: dict = {}
            for (cat, _), o in zip(prompts, outs):
                by_cat.setdefault(cat, []).append(o)
            row = {"all": counts(outs)}
            if len(by_cat) > 1:
                row.update({cat: counts(os) for cat, os in by_cat.items()})
            results.setdefault(d, {}).setdefault(method, {})[set_name] = row
            for cat, c in row.items():
                print(f"{d}  {method:13s} {set_name:12s} {cat:14s} tokens/step {c['tokens_per_target_step']:.3f}  "
                      f"acceptance {c['acceptance']:.3f}  first-token {c['first_token_acceptance']:.3f}", flush=True)
        del llm
if args.json:
    with open(args.json, "w") as f:
        json.dump({"k": args.k, "max_tokens": args.max_tokens, "problems": args.problems, "results": results}, f, indent=1)
