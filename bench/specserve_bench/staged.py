"""`specserve bench staged`: staged and hierarchical drafting against plain speculation with the same
draft model and regular decoding, batch 1, HumanEval prompts, every configuration run on each prompt
in turn (so that the machine's drift hits them alike):

- the staged paper's Table 1 (memory traffic per token relative to regular decoding: the weight and KV
  bytes every pass of every model reads, over the tokens emitted) and Table 2 (tokens/s greedy and
  top-k k=50 T=1), and its Figure 2 (per-problem speedup, sorted);
- the MIT 6.s898 report's tables: alpha, c and k per model pair, tokens/s with 2 and 3 levels, and
  the gain its formula predicts from them (as published, and with the target's verify pass priced on
  its measured step-time curve) against the gain measured.
"""
from __future__ import annotations

import os
import platform
import time
from typing import Optional

import torch
from tqdm.auto import tqdm

from specserve.cli.engine_args import llm_kwargs
from specserve.engine.llm import LLM
from specserve.speculative.hierarchy import Level, chain_gain
from specserve.types import SamplingParams

from .humaneval import humaneval_problems
from .output import write_results

SETTINGS = {"greedy": dict(temperature=0), "top-k 50, T=1": dict(temperature=1.0, top_k=50, seed=7)}
# The "How to make LLMs go fast" survey's threshold-decoding table: its three prompts, threshold decoding
# against fixed draft lengths, with the shipped draft
THRESHOLD_PROMPTS = ["What is a tensor in machine learning?", "Index: A B C", "The digits of Pi are 3.14159"]
THRESHOLD_CONFIGS = {"threshold": dict(policy="threshold"), **{f"fixed k={k}": dict(policy="fixed", draft_len=k)
                                                               for k in (1, 8, 16)}}


def _configs(args, target_path: str) -> dict:
    model = target_path if args.stage_model == "target" else args.stage_model
    mid = args.mid_model or args.stage_model
    common = dict(policy="fixed", draft_len=args.draft_len, fallback=False)
    return {"regular": None,
            "speculative": dict(method="draft", draft_model=model, **common),
            "staged, 2 levels": dict(method="staged", stages=[args.stage_model, args.last], **common),
            "staged, 3 levels": dict(method="staged", stages=[args.stage_model, mid, args.last], **common)}


def _kv_bytes_per_token(arch) -> int:
    return 2 * arch.num_hidden_layers * arch.num_key_value_heads * arch.head_dim * 4


def run_staged_bench(args) -> dict:
    torch.set_num_threads(args.threads or os.cpu_count())
    problems = humaneval_problems()[args.first:args.first + args.prompts]
    rd = LLM(**llm_kwargs(args))
    configs = _configs(args, rd.engine.model_path)
    llms = {name: rd if cfg is None else LLM(**llm_kwargs(args, speculative=cfg)) for name, cfg in configs.items()}
    for llm in llms.values():
        llm.generate(problems[0]["prompt"], SamplingParams(temperature=0, max_tokens=8))
    w_target = rd.engine.model.weight_bytes
    kv_target = _kv_bytes_per_token(rd.engine.model.arch)
    bar = tqdm(total=len(SETTINGS) * len(problems) * len(llms), desc="bench staged", unit="run")
    result = {"machine": {"platform": platform.platform(), "processor": platform.processor(),
                          "threads": torch.get_num_threads()},
              "model": os.path.basename(rd.engine.model_path), "stage_model": args.stage_model, "last": args.last,
              "draft_len": args.draft_len, "max_tokens": args.max_tokens, "settings": {}}
    for setting, kw in SETTINGS.items():
        params = SamplingParams(max_tokens=args.max_tokens, **kw)
        per = {name: {"tokens": [], "seconds": [], "context": []} for name in llms}
        for llm in llms.values():
            llm.reset_spec_stats()
        for p in problems:
            for name, llm in llms.items():
                t0 = time.perf_counter()
                out = llm.generate(p["prompt"], params)[0]
                per[name]["seconds"].append(time.perf_counter() - t0)
                n = len(out.outputs[0].token_ids)
                per[name]["tokens"].append(n)
                per[name]["context"].append(len(out.prompt_token_ids) + n / 2)
                per[name].setdefault("ttft", []).append(out.outputs[0].time_to_first_token or 0.0)
                per[name].setdefault("tpot", []).append(out.outputs[0].per_token_latency or 0.0)
                per[name].setdefault("ids", []).append(out.outputs[0].token_ids)
                bar.update()
        rows = {}
        base = sum(per["regular"]["tokens"]) / sum(per["regular"]["seconds"])
        context = sum(per["regular"]["context"]) / len(problems)
        regular_bytes = w_target + kv_target * context  # one target pass per token
        t_step = sum(per["regular"]["tpot"]) / len(problems)  # regular decoding's step, this run
        prefill = sum(per["regular"]["ttft"])
        for name, llm in llms.items():
            tokens, secs = sum(per[name]["tokens"]), sum(per[name]["seconds"])
            row = {"tokens_per_s": tokens / secs, "measured_gain": tokens / secs / base,
                   # greedy: token for token what regular decoding gave (lossless); sampled: not comparable
                   "identical_to_regular": per[name]["ids"] == per["regular"]["ids"] if not params.temperature else None,
                   "per_problem_gain": [(t / s) / (tr / sr) for t, s, tr, sr in zip(
                       per[name]["tokens"], per[name]["seconds"], per["regular"]["tokens"], per["regular"]["seconds"])]}
            st = llm.spec_stats()
            if st is not None:
                passes = st["target_steps"]
                traffic = passes * (w_target + kv_target * context)
                models = st.get("stage_models") or []
                for s in models:  # KV read as if the draft had the target's shape (here it is the target)
                    traffic += s["passes"] * (s["weight_bytes"] + kv_target * context)
                row.update({"alpha": st["alpha"], "c": st["c"], "tokens_per_target_step": st["tokens_per_target_step"],
                            "traffic_per_token": traffic / tokens / regular_bytes,
                            **{k: st.get(k) for k in ("stages", "predicted_gain", "predicted_gain_cpu", "verify_cost")}})
                row["predicted_gain_this_run"] = _predict_this_run(st, t_step, prefill)
            else:
                row["traffic_per_token"] = 1.0
            rows[name] = row
        result["settings"][setting] = rows
    bar.close()
    del llms  # their KV caches and draft models: the threshold table loads its own
    if args.threshold_table:
        result["threshold"] = threshold_table(rd, args)
    return _write(result, args.out)


def threshold_table(rd: LLM, args) -> dict:
    """Per survey prompt: tokens/s of regular decoding and of threshold / fixed-k drafting (the shipped
    draft, no fallback: the policies themselves are compared), interleaved per prompt."""
    llms = {name: LLM(**llm_kwargs(args, speculative=dict(method="draft", fallback=False, **cfg)))
            for name, cfg in THRESHOLD_CONFIGS.items()}
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    for llm in llms.values():
        llm.generate(THRESHOLD_PROMPTS[0], SamplingParams(temperature=0, max_tokens=8))
    table = {}
    for prompt in tqdm(THRESHOLD_PROMPTS, desc="threshold table"):
        row = {}
        for name, llm in [("regular", rd)] + list(llms.items()):
            if name != "regular":
                llm.reset_spec_stats()
            best = None
            for _ in range(args.threshold_repeats):  # the best of a few runs: short generations, noisy VM
                t0 = time.perf_counter()
                out = llm.generate(prompt, params)[0].outputs[0]
                rate = len(out.token_ids) / (time.perf_counter() - t0)
                best = rate if best is None else max(best, rate)
            st = llm.spec_stats() if name != "regular" else None
            row[name] = {"tokens_per_s": best, "tokens_per_target_step": st and st["tokens_per_target_step"],
                         "acceptance_rate": st and st["acceptance_rate"]}
        for v in row.values():
            v["speedup"] = v["tokens_per_s"] / row["regular"]["tokens_per_s"]
        table[prompt] = row
    return table


def _predict_this_run(st: dict, t_step: float, prefill: float) -> Optional[float]:
    """The formula with the top pair's c and verify cost measured against regular decoding's step in
    this same run (the engine's own c divides by a step time measured at another moment, and the
    formula prices verification as one step): c = the stage model's seconds per pass / t_step, v = the
    target's seconds per verify step (its prefills, taken as regular decoding's, left out) / t_step."""
    stages, models = st.get("stages") or [], st.get("stage_models") or []
    if not stages or not models or not st["spec_steps"] or any(p[x] is None for p in stages for x in ("alpha", "c", "k")):
        return None
    # staged: the drafter's own timing of its model's passes (batch 1); a plain draft model: all of its
    # drafting time over its passes
    per_pass = st.get("stage_pass_seconds") or st["draft_seconds"] / max(models[0]["passes"], 1)
    c = per_pass / t_step
    v = max(st["target_seconds"] - prefill, 0.0) / st["spec_steps"] / t_step
    levels = [Level(stages[0]["alpha"], c, stages[0]["k"], v)] + [Level(p["alpha"], p["c"], p["k"]) for p in stages[1:]]
    return chain_gain(levels)


def _write(result: dict, out_dir: str) -> dict:
    return write_results(result, out_dir, "staged", markdown, plot)


def _f(x, fmt="{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def markdown(r: dict) -> str:
    m = r["machine"]
    lines = [f"# Staged and hierarchical drafting: {r['model']}, batch 1, {r['max_tokens']} tokens, fixed k={r['draft_len']}",
             "", f"Machine: {m['processor'] or m['platform']}, {m['threads']} threads. Stage model: {r['stage_model']}; "
             f"last stage: {r['last']}.", ""]
    for setting, rows in r["settings"].items():
        lines += [f"## {setting}", "",
                  "| configuration | tokens/s | measured gain | predicted: formula, engine's c | + CPU verify cost "
                  "| + c, v measured this run | memory traffic per token | tokens per target step |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, row in rows.items():
            lines.append(f"| {name} | {row['tokens_per_s']:.1f} | {row['measured_gain']:.3f}x | "
                         f"{_f(row.get('predicted_gain'), '{:.3f}x')} | {_f(row.get('predicted_gain_cpu'), '{:.3f}x')} | "
                         f"{_f(row.get('predicted_gain_this_run'), '{:.3f}x')} | "
                         f"{row['traffic_per_token']:.2f} | {_f(row.get('tokens_per_target_step'))} |")
        lines += ["", "Per pair (alpha, c, k):", ""]
        for name, row in rows.items():
            for s in row.get("stages") or []:
                lines.append(f"- {name}: {s['pair']}: alpha {_f(s['alpha'])}, c {_f(s['c'], '{:.3f}')}, k {_f(s['k'])}")
        lines.append("")
    if r.get("threshold"):
        names = list(next(iter(r["threshold"].values())))
        lines += ["## Threshold decoding (the survey's table): speedup over regular decoding (tokens per target step)", "",
                  "| prompt | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        for prompt, row in r["threshold"].items():
            cells = [f"{row[n]['speedup']:.2f}x" + (f" ({row[n]['tokens_per_target_step']:.2f})"
                                                     if row[n]["tokens_per_target_step"] else "") for n in names]
            lines.append(f"| {prompt} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def plot(r: dict, path: str) -> None:
    """The staged paper's Figure 2: per-problem speedup over regular decoding, sorted."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(r["settings"]), figsize=(6 * len(r["settings"]), 4), squeeze=False)
    for ax, (setting, rows) in zip(axes[0], r["settings"].items()):
        for name, row in rows.items():
            if name != "regular":
                ax.plot(sorted(row["per_problem_gain"]), marker=".", label=name)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xlabel("problem (sorted)")
        ax.set_ylabel("speedup over regular decoding")
        ax.set_title(f"{r['model']}: {setting}")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
