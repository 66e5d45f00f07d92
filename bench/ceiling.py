"""What batch-1 speculation can reach on this CPU with a draft chain, from the engine's own costs.

A chain of k draft tokens, each accepted with probability alpha given the ones before (the geometric
model of Leviathan et al.), gives (1 - alpha^(k+1)) / (1 - alpha) tokens per step and costs a target
pass over 1 + k rows plus k draft passes. With the pass times this engine calibrates at start-up (the
cost model's curve) and the draft pass it measures on HumanEval, this prints, per k, a row's price,
and the per-token acceptance a draft needs for 1.0x, 1.3x and 1.5x regular decoding; beside them the
acceptance the shipped draft reaches here (fixed k, no fallback), on HumanEval and on the bench's
prompts beyond code. Free drafts (prompt lookup, suffix) and trees move the figures somewhat (they add
tokens without draft passes, or rows per accepted token); bench/auto_ab.py measures the whole engine.

    python bench/ceiling.py [--k 3] [--prompts 8] [--per-category 2]  ->  bench/results/ceiling-<time>.md
    python bench/ceiling.py --model qwen2.5-coder-1.5b --draft-model qwen2.5-coder-0.5b --activations int8 \
        --draft-vocab 65536 --draft-quant q4_0    (the real pair, issue 40)

For each prompt set it also prints the dearest draft pass (as a share of a one-row target pass, c)
at which the measured acceptance would still reach each speedup: how much cheaper a draft must be.

Staged drafting (the MIT report's chain, speculative/hierarchy.chain_gain): the draft model itself
sped up by a free proposer (prompt lookup, the n-gram model: microseconds a token) whose proposals the
draft keeps with per-token acceptance alpha2, each round one draft pass over 1 + k2 rows (its own
curve, timed here). The last table prints, per prompt set at the measured acceptance, the best staged
chain at a few alpha2 against the best plain chain, and the least alpha2 for staged to reach 1.15x
the plain chain: what the lower stage must deliver.

Batches (--batches 8,16; issue 37 asks 1.3x at batch 8): B sequences drafting k tokens each make one
target pass over B (1 + k) rows, plus k draft passes over B rows for the draft model (nothing for a
free drafter), for B (1 - alpha^(k+1)) / (1 - alpha) tokens against regular decoding's B tokens per pass
over B rows:

    gain(alpha, k, B) = E(alpha, k) T(B) / (T(B (1 + k)) + k D(B)),   E = (1 - alpha^(k+1)) / (1 - alpha)

with T the target's calibrated curve and D the draft's pass over B rows as `draft_curve` times it (every
row over the target's whole vocabulary: above a batch-B draft step with a cut head, so the draft
column is a lower bound of its gain; the free drafter's is exact under the model). The table prints, per batch, the least
acceptance that reaches each speedup with the best k, for a free drafter and for the draft model, and
the gain at the draft model's measured acceptance.
"""
import argparse
import time

from specserve import LLM, SamplingParams
from specserve.speculative import CostModel, calibrate
from specserve.speculative.hierarchy import Level, chain_gain
from specserve.types import Request
from specserve_bench.humaneval import humaneval_problems
from specserve_bench.machine import cpu
from specserve_bench.spec_shapes import prompt_sets

TARGETS = (1.0, 1.15, 1.3, 1.5)
ALPHA2 = (0.3, 0.5, 0.7, 0.9)  # the lower stage's acceptance by the draft, for the staged table
STAGED_OVER_CHAIN = 1.15  # issue 40: staged at least 1.15x plain draft-model speculation


def top_level(alpha: float, k: int, t: dict, t_draft: float) -> Level:
    """The target's pair with the draft: c and the verify pass v measured against a one-row pass."""
    return Level(alpha, t_draft / t[1], k, t[1 + k] / t[1])


def speedup(alpha: float, k: int, t: dict, t_draft: float) -> float:
    """Tokens per second of a k-token chain at acceptance alpha, over regular decoding's (batch 1):
    Leviathan's gain of the target's pair."""
    return chain_gain([top_level(alpha, k, t, t_draft)])


def first(hundredths, ok, none: str = "none") -> str:
    """The first x / 100 (x in `hundredths`, in order) for which ok(x / 100) holds, to 0.01, else `none`:
    the searches of the tables below."""
    return next((f"{x / 100:.2f}" for x in hundredths if ok(x / 100)), none)


def needed(target: float, ks, t: dict, t_draft: float) -> str:
    """The least acceptance (to 0.01) at which some k reaches `target`."""
    return first(range(0, 101), lambda a: max(speedup(a, k, t, t_draft) for k in ks) >= target)


def max_c(target: float, alpha: float, ks, t: dict) -> str:
    """The dearest draft pass (c, to 0.01 of a one-row pass) at which some k reaches `target` at acceptance alpha."""
    return first(range(100, -1, -1), lambda c: max(speedup(alpha, k, t, c * t[1]) for k in ks) >= target)


def draft_curve(llm, rows, context: int = 128) -> dict:
    """The draft model's pass over n rows after `context` tokens, every row's logits over the target's
    vocabulary, as a staged level scores its helper's proposals (the fastest of three) -> {n: seconds}."""
    d = llm.engine.speculator.drafter
    r = Request("ceiling-draft-curve", [100 + i % 1000 for i in range(context)], SamplingParams(temperature=0))
    if not d.reserve(r, context + max(rows)):
        raise RuntimeError("the draft's KV cache has no room for the timing pass")
    d.catch_up([r])
    out = {}
    for n in rows:
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            d.score([r], [[100] * n], [context], every_row=True, full_vocab=True)
            best = min(best, time.perf_counter() - t0)
        out[n] = best
    d.release(r)
    return out


def staged_best(alpha: float, alpha2: float, ks, t: dict, t_draft: float, t2: dict) -> float:
    """The best chain target <- draft <- a free proposer over k (target side) and k2 (the draft's span),
    against regular decoding."""
    return max(chain_gain([top_level(alpha, k, t, t_draft), Level(alpha2, 0.0, k2, t2[1 + k2] / t2[1])])
               for k in ks for k2 in ks)


def staged_needed(alpha: float, ks, t: dict, t_draft: float, t2: dict) -> str:
    """The least alpha2 (to 0.01) at which the staged chain reaches STAGED_OVER_CHAIN x the best plain chain."""
    plain = max(speedup(alpha, k, t, t_draft) for k in ks)
    return first(range(0, 100), lambda a2: staged_best(alpha, a2, ks, t, t_draft, t2) >= STAGED_OVER_CHAIN * plain,
                 "none below 1")


BATCH_KS = (1, 2, 3, 4)


def batch_gain(alpha: float, k: int, b: int, t: dict, d: dict) -> float:
    """Tokens per second of B sequences drafting k tokens each at acceptance alpha, over regular
    decoding's at batch B (d: the draft's pass over B rows, {} for a free drafter)."""
    tokens = (1 - alpha ** (k + 1)) / (1 - alpha) if alpha < 1 else k + 1
    return tokens * t[b] / (t[b * (1 + k)] + k * d.get(b, 0.0))


def batch_needed(target: float, b: int, t: dict, d: dict) -> str:
    """The least acceptance (to 0.01) at which some k reaches `target` at batch b."""
    return first(range(0, 101), lambda a: max(batch_gain(a, k, b, t, d) for k in BATCH_KS) >= target)


def batch_table(batches, t: dict, d: dict, alphas: dict) -> list[str]:
    lines = ["", "Batches: a pass over B (1 + k) rows / over B rows, and the acceptance each speedup needs "
             "(best k of " + ", ".join(map(str, BATCH_KS)) + "; free: a drafter that costs nothing; draft: the "
             "draft model's k passes over B rows).", "",
             "| B | pass over B rows, ms | " + " | ".join(f"k={k}" for k in BATCH_KS) + " | "
             + " | ".join(f"alpha for {x}x free / draft" for x in TARGETS[1:]) + " | "
             + " | ".join(f"draft at {name}'s {a:.3f}" for name, a in alphas.items()) + " |",
             "|---|---|" + "---|" * (len(BATCH_KS) + len(TARGETS) - 1 + len(alphas))]
    for b in batches:
        lines.append(f"| {b} | {1e3 * t[b]:.1f} | " + " | ".join(f"{t[b * (1 + k)] / t[b]:.2f}" for k in BATCH_KS) + " | "
                     + " | ".join(f"{batch_needed(x, b, t, {})} / {batch_needed(x, b, t, d)}" for x in TARGETS[1:]) + " | "
                     + " | ".join(f"{max(batch_gain(a, k, b, t, d) for k in BATCH_KS):.2f}x" for a in alphas.values()) + " |")
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, default=3, help="the fixed draft length the acceptance is measured at")
    ap.add_argument("--prompts", type=int, default=8, help="HumanEval problems")
    ap.add_argument("--per-category", type=int, default=2, help="prompts per category beyond code")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--model", default=None, help="default: the embedded model")
    ap.add_argument("--draft-model", default=None, help="default: the shipped draft")
    ap.add_argument("--draft-vocab", type=int, default=0, help="the draft head's reduced vocabulary (0: all of it)")
    ap.add_argument("--draft-quant", default="none", help="the draft's wider weights re-encoded as this GGML type")
    ap.add_argument("--activations", default="fp32", choices=["fp32", "int8"])
    ap.add_argument("--batches", default="", help="batch sizes for the batch table, e.g. 8,16 (none: batch 1 only)")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",") if b]
    machine = cpu()
    spec = {"method": "draft", "policy": "fixed", "draft_len": args.k, "fallback": False, "draft_vocab": args.draft_vocab,
            "draft_quant": args.draft_quant}
    if args.draft_model:
        spec["draft_model"] = args.draft_model
    llm = LLM(**({"model": args.model} if args.model else {}), activations=args.activations, kv_cache_gib=1.0,
              speculative=spec)
    costs = llm.engine.speculator.costs
    sets = prompt_sets(llm, humaneval_problems()[:args.prompts], args.per_category)
    params = SamplingParams(temperature=0, max_tokens=128)
    alphas = {}
    for name in ("humaneval", "beyond code"):
        llm.generate(sets[name][0]["prompt"], params)  # warm up (and, on HumanEval, the draft step's timing)
        llm.reset_spec_stats()
        for p in sets[name]:  # batch 1
            llm.generate(p["prompt"], params)
        s = llm.engine.speculator.stats
        alphas[name] = s.accepted / max(1, s.accepted + s.rejections)  # the geometric model's estimate
    # bare passes over 1 .. 9 rows, the fastest of three each, as the engine calibrates at start-up
    curve, eng = CostModel(), llm.engine
    rows = sorted(set(range(1, 10)) | {b * (1 + k) for b in batches for k in (0, *BATCH_KS)})
    calibrate(curve, eng.model, eng.kv, eng.scheduler.blocks, eng.runner.attention, eng.runner.plain_attention,
              max_rows=max(rows), rows=tuple(rows))
    ks = list(range(1, 9))
    t = curve.calibrated
    t_draft = costs.draft_step_seconds(1)
    t2 = draft_curve(llm, sorted(set(range(1, 10)) | set(batches)))
    lines = [f"# Batch-1 chain speculation's ceiling on this CPU ({machine['cpu']}, {', '.join(machine['flags'])})", "",
             f"`python bench/ceiling.py --k {args.k} --prompts {args.prompts} --per-category {args.per_category}"
             + (f" --model {args.model}" if args.model else "") + (f" --draft-model {args.draft_model}" if args.draft_model else "")
             + (f" --draft-vocab {args.draft_vocab}" if args.draft_vocab else "")
             + (f" --draft-quant {args.draft_quant}" if args.draft_quant != "none" else "") + f" --activations {args.activations}"
             + (f" --batches {args.batches}" if batches else "") + "`: "
             "bare target passes from the start-up calibration; "
             f"one draft pass {1e3 * t_draft:.2f} ms ({t_draft / t[1]:.3f} of a one-row pass).", "",
             "| draft tokens k | pass over 1 + k rows, ms | extra row / one-row pass | "
             + " | ".join(f"alpha for {x}x at this k" for x in TARGETS) + " |",
             "|---|---|---|" + "---|" * len(TARGETS)]
    for k in ks:
        lines.append(f"| {k} | {1e3 * t[1 + k]:.1f} | {(t[1 + k] - t[1]) / k / t[1]:.3f} | "
                     + " | ".join(needed(x, [k], t, t_draft) for x in TARGETS) + " |")
    lines += ["", f"one-row pass: {1e3 * t[1]:.1f} ms. Best k: alpha "
              + ", ".join(f"{needed(x, ks, t, t_draft)} for {x}x" for x in TARGETS) + ".", "",
              f"| prompts | the draft's per-token acceptance (k={args.k}, greedy) | chain model's best speedup at it | "
              + " | ".join(f"c for {x}x at it" for x in TARGETS[1:]) + " |",
              "|---|---|---|" + "---|" * len(TARGETS[1:])]
    for name, a in alphas.items():
        lines.append(f"| {name} | {a:.3f} | {max(speedup(a, k, t, t_draft) for k in ks):.2f}x | "
                     + " | ".join(max_c(x, a, ks, t) for x in TARGETS[1:]) + " |")
    lines += ["", "Staged: the draft sped up by a free proposer (its pass over 1 + k2 rows / one row: "
              + ", ".join(f"{t2[1 + k] / t2[1]:.2f}" for k in (1, 2, 4, 8)) + " at k2 = 1, 2, 4, 8).", "",
              "| prompts | plain chain's best | " + " | ".join(f"staged at alpha2 {a2}" for a2 in ALPHA2)
              + f" | alpha2 for staged {STAGED_OVER_CHAIN}x the plain chain |",
              "|---|---|" + "---|" * len(ALPHA2) + "---|"]
    for name, a in alphas.items():
        lines.append(f"| {name} | {max(speedup(a, k, t, t_draft) for k in ks):.2f}x | "
                     + " | ".join(f"{staged_best(a, a2, ks, t, t_draft, t2):.2f}x" for a2 in ALPHA2)
                     + f" | {staged_needed(a, ks, t, t_draft, t2)} |")
    if batches:
        lines += batch_table(batches, t, {b: t2[b] for b in batches}, alphas)
    path = f"{args.out}/ceiling-{time.strftime('%Y%m%d-%H%M%S')}.md"
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print("written", path)


if __name__ == "__main__":
    main()
