"""`specserve bench nbest`: BASS section 4.5 / Figure 5 on this machine. Within a time budget per
problem, b samples of a HumanEval problem race the deadline (SamplingParams best_of_deadline_s); the
answer holds those finished by then, ranked by mean log-probability. Pass@First: the first (the
pick) passes the problem's tests; Pass@All: any of them does. Regular decoding and speculative
decoding (BASS batching with the draft) answer the same problems at batch 1..16, taking turns problem
by problem (the machine's speed drifts).

Problems are the first --problems of HumanEval, asked through the chat template for the whole function
in a code block (the instruct model's format; bench/spec.py), sampled at T=0.8, top-p 0.95. Prefix
caching is off in both engines: every answer prefills its prompt (the draft cannot reuse cached KV).
"""
from __future__ import annotations

import time

from tqdm.auto import tqdm

from specserve.cli.engine_args import llm_kwargs
from specserve.engine.llm import LLM
from specserve.types import SamplingParams

from .humaneval import humaneval_problems
from .machine import cpu
from .output import write_results
from .spec import chat_prompt, extract_code, passes

SEED = 1234


def _passes(problem: dict, text: str, cache: dict) -> bool:
    """spec.passes, once per distinct code (samples of easy problems often repeat)."""
    key = (problem["task_id"], extract_code(text))
    if key not in cache:
        cache[key] = passes(problem, text)
    return cache[key]


def _answer(llm: LLM, problem: dict, prompt: list[int], b: int, args, seed: int, cache: dict) -> dict:
    params = SamplingParams(n=b, temperature=args.temperature, top_p=0.95, seed=seed, max_tokens=args.max_tokens,
                            best_of_deadline_s=args.budget)
    t0 = time.perf_counter()
    outs = llm.generate(prompt, params)[0].outputs
    wall = time.perf_counter() - t0
    finished = [o for o in outs if o.finish_reason != "deadline"]
    ok = [_passes(problem, o.text, cache) for o in finished]
    return {"first": bool(ok) and ok[0], "all": any(ok), "finished": len(finished), "passed": sum(ok), "wall_s": wall}


def run_nbest_bench(args) -> dict:
    kw = llm_kwargs(args, enable_prefix_caching=False)
    spec_cfg = {"method": args.speculative, "policy": "bass"}
    engines = {"regular": LLM(**kw), "speculative": LLM(speculative=spec_cfg, **kw)}
    problems = humaneval_problems()[:args.problems]
    batches = [int(x) for x in args.batch_sizes.split(",")]
    prompts = [chat_prompt(engines["regular"], p) for p in problems]
    for llm in engines.values():  # warm-up: kernels, the draft, the cost model's first steps
        llm.generate(prompts[0], SamplingParams(n=2, temperature=0.8, seed=0, max_tokens=16))
        if llm.engine.speculator is not None:
            llm.reset_spec_stats()
    cache: dict = {}
    runs = {name: {b: [] for b in batches} for name in engines}
    bar = tqdm(total=len(problems) * len(batches) * len(engines), desc="nbest bench")
    for i, (problem, prompt) in enumerate(zip(problems, prompts)):
        for b in batches:
            names = list(engines) if (i + b) % 2 == 0 else list(reversed(engines))
            for name in names:
                runs[name][b].append(_answer(engines[name], problem, prompt, b, args, SEED + i, cache))
                bar.update()
    bar.close()
    result = {"cpu": cpu(), "time": time.strftime("%Y-%m-%d %H:%M:%S"), "problems": len(problems),
              "budget_s": args.budget, "max_tokens": args.max_tokens, "temperature": args.temperature,
              "speculative": spec_cfg, "spec_stats": engines["speculative"].spec_stats(), "table": {}}
    for name, by_b in runs.items():
        result["table"][name] = {}
        for b, rs in by_b.items():
            n = len(rs)
            result["table"][name][b] = {
                "pass_at_first": round(sum(r["first"] for r in rs) / n, 4),
                "pass_at_all": round(sum(r["all"] for r in rs) / n, 4),
                "finished_per_problem": round(sum(r["finished"] for r in rs) / n, 2),
                "finished_share": round(sum(r["finished"] for r in rs) / (n * b), 3),
                "passing_samples": sum(r["passed"] for r in rs),
                "mean_wall_s": round(sum(r["wall_s"] for r in rs) / n, 3)}
    return write_results(result, args.out, "nbest", _markdown, _plot)


def _markdown(r: dict) -> str:
    lines = [f"# Time-budget n-best (BASS section 4.5, Figure 5): HumanEval, {r['budget_s']} s per problem", "",
             f"CPU: {r['cpu']['cpu']}, flags {', '.join(r['cpu']['flags'])}; the first {r['problems']} HumanEval problems "
             f"through the chat template; T={r['temperature']}, top-p 0.95, up to {r['max_tokens']} tokens; speculative: "
             f"{r['speculative']}", "",
             "b samples per problem race the budget; the answer holds those finished by then, ranked by mean "
             "log-probability. Pass@First: the first passes; Pass@All: any passes (fractions of problems).", "",
             "| batch | Pass@First regular | Pass@First spec | Pass@All regular | Pass@All spec | finished in budget "
             "regular | spec | passing samples regular | spec | s per problem regular | spec |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    reg, spec = r["table"]["regular"], r["table"]["speculative"]
    for b in reg:
        a, s = reg[b], spec[b]
        lines.append(f"| {b} | {a['pass_at_first']:.3f} | {s['pass_at_first']:.3f} | {a['pass_at_all']:.3f} | "
                     f"{s['pass_at_all']:.3f} | {a['finished_share']:.0%} | {s['finished_share']:.0%} | "
                     f"{a['passing_samples']} | {s['passing_samples']} | {a['mean_wall_s']:.2f} | {s['mean_wall_s']:.2f} |")
    st = r.get("spec_stats") or {}
    if st.get("tokens_per_target_step") is not None:
        lines += ["", f"Speculation over the run: {st['tokens_per_target_step']:.2f} tokens per target step, acceptance "
                      f"{st['acceptance_rate']:.2f}, {st.get('fallback_steps', 0)} plain steps (the cost model's fallback)."]
    lines.append("")
    return "\n".join(lines)


def _plot(r: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, key, title in zip(axes, ("pass_at_first", "pass_at_all", "finished_share"),
                              ("Pass@First", "Pass@All", "samples finished in budget")):
        for name, style in (("regular", "o--"), ("speculative", "s-")):
            t = r["table"][name]
            bs = [int(b) for b in t]
            ax.plot(bs, [t[b][key] for b in t], style, label=name)
        ax.set_xscale("log", base=2)
        ax.set_xticks(bs, [str(b) for b in bs])
        ax.set_xlabel("batch size (samples per problem)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"HumanEval ({r['problems']} problems) within {r['budget_s']} s per problem")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
