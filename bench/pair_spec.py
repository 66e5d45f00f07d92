"""Speculative decoding with the real pair (issue 40): Qwen2.5-Coder-1.5B drafted by its 0.5B sibling,
against the engine's own regular decoding and against llama.cpp's own speculative decoding on the same
two files, same threads, in one run. Greedy, batch 1, HumanEval prompts and the bench's prompts beyond
code, all through the chat template.

  python bench/pair_spec.py [--activations int8] [--humaneval 6] [--per-category 1] [--max-tokens 128]
      [--methods regular,suffix,draft,draft-fr,staged,staged-fr,auto-fr] [--draft-vocab 32768]
      [--llamacpp-grid 16:0:0.75,8:0:0.5,4:0:0.0] [--out bench/results]

Rates are decode rates: tokens after the first over the time after it (TTFT excluded), which is what
llama-speculative-simple reports ("decoded N tokens in T s"); llama.cpp's regular decoding is
llama-cpp-python's (the same llama.cpp release). llama.cpp's speculative binary comes from
`make llamacpp-spec`; without it that column is left out, said so. Output: bench/results/pair-spec-*.md/.json.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import subprocess
import time

from specserve import LLM, SamplingParams
from specserve.loading import resolve_model_path
from specserve_bench import peers
from specserve_bench.humaneval import humaneval_problems
from specserve_bench.machine import cpu
from specserve_bench.output import write_results
from specserve_bench.prompts import conversations
from specserve_bench.spec import chat_prompt

LLAMA_SPEC = os.path.join(os.path.dirname(__file__), "..", "build", "llamacpp", "bin", "llama-speculative-simple")

# name -> the speculative config (None: regular decoding); "-fr": the draft's head over --draft-vocab tokens
METHODS = {
    "regular": None,
    "suffix": dict(method="suffix"),
    "draft": dict(method="draft"),
    "draft-fr": dict(method="draft", fr=True),
    "staged": dict(method="staged", stages=["draft", "lookup"]),
    "staged-fr": dict(method="staged", stages=["draft", "lookup"], fr=True),
    "auto": dict(method="auto"),
    "auto-fr": dict(method="auto", fr=True),
    # the draft's weights wider than Q4_0 re-encoded as Q4_0 (--draft-quant): fewer bytes a draft pass reads
    "draft-fr-q4": dict(method="draft", fr=True, draft_quant="q4_0"),
    "staged-fr-q4": dict(method="staged", stages=["draft", "lookup"], fr=True, draft_quant="q4_0"),
    "auto-fr-q4": dict(method="auto", fr=True, draft_quant="q4_0"),
    # token trees from the draft model (its top-k children at the beam best nodes of each level)
    "draft-tree": dict(method="draft", shape="tree"),
    "draft-fr-tree": dict(method="draft", shape="tree", fr=True),
    "draft-fr-shape-auto": dict(method="draft", shape="auto", fr=True),  # chains or trees, by measured yield
    # a narrow tree: one node expanded per level (the draft's passes stay one row), its 2 best children
    "draft-fr-tree-narrow": dict(method="draft", shape="tree", tree_top_k=2, tree_beam=1, tree_max_nodes=8, fr=True),
    # the cost model's fallback off, a fixed draft length: what drafting yields where the choice is not asked
    "draft-k4": dict(method="draft", policy="fixed", draft_len=4, fallback=False),
    "draft-fr-k4": dict(method="draft", policy="fixed", draft_len=4, fallback=False, fr=True),
}


def decode_rate(out) -> float:
    o = out.outputs[0]
    n = len(o.token_ids)
    return (n - 1) / (o.per_token_latency * (n - 1)) if n > 1 and o.per_token_latency else float("nan")


def e2e_rate(out) -> float:
    """Tokens over the whole request: TTFT (the prompt, the draft model's included) and decoding."""
    o = out.outputs[0]
    n = len(o.token_ids)
    return n / (o.time_to_first_token + (n - 1) * (o.per_token_latency or 0.0))


def run_specserve(args, sets: dict, draft: str) -> dict:
    res = {}
    for name in args.methods:
        spec = METHODS[name]
        if spec is not None:
            spec = dict(spec)
            fr = spec.pop("fr", False)
            spec.update(draft_model=draft, draft_vocab=args.draft_vocab if fr else 0)
            if spec["method"] == "suffix":
                spec.pop("draft_model"), spec.pop("draft_vocab")
        t0 = time.perf_counter()
        llm = LLM(args.model, speculative=spec, activations=args.activations, kv_cache_gib=0.5, num_threads=args.threads)
        load_s = time.perf_counter() - t0
        params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
        plain = SamplingParams(temperature=0, max_tokens=args.max_tokens, speculative=False)
        llm.generate(sets["humaneval"][0], SamplingParams(temperature=0, max_tokens=8))  # warm-up
        r = {"load_s": load_s}
        for set_name, prompts in sets.items():
            outs, paired, paired_e2e, steps, emitted = [], [], [], 0, 0.0
            lower = []  # per prompt, a staged draft's pair with its helper: (alpha, proposals per pass)
            for p in prompts:
                if spec is not None:
                    llm.reset_spec_stats()
                outs.append(llm.generate(p, params)[0])
                if spec is not None:  # the speculative run's target steps; then regular decoding of the same
                    st = llm.spec_stats()  # prompt right after, on the same engine
                    steps += st["target_steps"]
                    emitted += st["target_steps"] * st["tokens_per_target_step"]
                    pairs = st.get("stages") or []
                    if len(pairs) > 1 and pairs[1]["alpha"] is not None and pairs[1]["k"] is not None:
                        lower.append((pairs[1]["alpha"], pairs[1]["k"]))
                    reg = llm.generate(p, plain)[0]
                    paired.append(decode_rate(reg))
                    paired_e2e.append(e2e_rate(reg))
            r[set_name] = {"rates": [decode_rate(o) for o in outs], "tokens": [o.outputs[0].token_ids for o in outs],
                           "e2e": [e2e_rate(o) for o in outs], "ttft": [o.outputs[0].time_to_first_token for o in outs]}
            if spec is not None:  # per set: emitted tokens per target step, and the paired regular rates
                r[set_name].update(tokens_per_step=emitted / max(1, steps), regular_rates=paired, regular_e2e=paired_e2e)
                if lower:  # the lower stage's share of proposals kept, and proposals per draft pass (prompt means)
                    r[set_name]["lower_stage"] = {"alpha": statistics.mean(a for a, _ in lower),
                                                  "k": statistics.mean(k for _, k in lower)}
        if spec is not None:
            r["stats"] = {"c": llm.spec_stats().get("c")}  # from the whole run's timings
            d = llm.engine.speculator.drafter
            ids = getattr(getattr(d, "model", d), "vocab_ids", None)
            if ids is not None:  # the share of regular decoding's tokens the reduced head can propose
                keep = set(ids.tolist())
                toks = [t for s in sets for seq in res.get("regular", {}).get(s, {}).get("tokens", []) for t in seq]
                r["vocab_coverage"] = sum(t in keep for t in toks) / max(1, len(toks))
        res[name] = r
        print(f"{name}: " + ", ".join(f"{s} {statistics.median(r[s]['rates']):.1f} tok/s" for s in sets), flush=True)
        del llm
    return res


def run_llamacpp_spec(args, texts: dict, target: str, draft: str) -> dict:
    """llama-speculative-simple per prompt and grid point -> decode tokens/s and acceptance."""
    out = {}
    for point in args.llamacpp_grid:
        dmax, dmin, pmin = point.split(":")
        r = {}
        for set_name, prompts in texts.items():
            rates, acc = [], []
            for text in prompts:
                cmd = [LLAMA_SPEC, "-m", target, "-md", draft, "-p", text, "-n", str(args.max_tokens), "-t", str(args.threads),
                       "-td", str(args.threads), "--temp", "0", "-c", "4096", "-nr", "--spec-type", "draft-simple",
                       "--spec-draft-n-max", dmax, "--spec-draft-n-min", dmin, "--spec-draft-p-min", pmin]
                # with its weight repacking (extra buffer types), as the regular peer runs; without it
                # (-nr) where that crashes (its AMX repacking segfaults on some VMs)
                p = subprocess.run([c for c in cmd if c != "-nr"], capture_output=True, text=True, timeout=600)
                if p.returncode != 0:
                    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
                log = p.stdout + p.stderr
                m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s", log)
                a = re.search(r"accept\s+=\s+([\d.]+)%", log)
                if m is None:
                    raise RuntimeError(f"llama-speculative-simple failed (rc {p.returncode}): {log[-400:]}")
                rates.append(float(m.group(3)))
                acc.append(float(a.group(1)) / 100 if a else None)
            r[set_name] = {"rates": rates, "acceptance": acc}
        out[point] = r
        print(f"llama.cpp spec {point}: " + ", ".join(f"{s} {statistics.median(r[s]['rates']):.1f} tok/s" for s in texts),
              flush=True)
    return out


def paired_ratio(m: dict, key: str = "rates") -> tuple[float, float]:
    """Speculative over regular decoding, each prompt's pair run back to back on one engine (a shared
    VM's speed drifts by tens of percent over minutes): the geometric mean of the prompts' ratios, and
    the factor of its 2-standard-error interval (ratio / f .. ratio * f). key: "rates" (decode) or
    "e2e" (whole requests, TTFT included)."""
    reg = m.get("regular_rates" if key == "rates" else "regular_e2e")
    if not reg:
        return 1.0, 1.0
    logs = [math.log(a / b) for a, b in zip(m[key], reg)]
    se = statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else 0.0
    return math.exp(sum(logs) / len(logs)), math.exp(2 * se)


def markdown(r: dict) -> str:
    sets = r["sets"]
    reg = r["specserve"]["regular"]
    lines = [f"# The real pair: {r['model']} drafted by {r['draft']} (issue 40)", "",
             f"{r['machine']['cpu']} ({', '.join(r['machine']['flags'])}), {r['threads']} threads, activations "
             f"{r['activations']}, greedy, batch 1, up to {r['max_tokens']} new tokens; {r['n']} prompts per set. "
             "Decode tokens/s (TTFT excluded), median over the prompts; 'vs regular': each prompt's speculative run "
             "against its regular run right after on the same engine (geometric mean of the prompts' ratios); "
             "llama.cpp's against specserve's regular runs. In brackets: the ratio's 2-standard-error interval "
             "over the prompts. 'whole requests': the same pairing over each request's tokens / (TTFT + decoding), "
             "where a draft model's prompt counts (it runs in the prompt's steps); TTFT: median seconds.", "",
             f"`{r['command']}`", "",
             "| engine / method | " + " | ".join(f"{s} tok/s | vs regular | whole requests | TTFT | identical" for s in sets)
             + " | tokens/target step (per set) | c | draft acceptance |",
             "|---|" + "---|---|---|---|---|" * len(sets) + "---|---|---|"]

    def ratio(m, key):
        x, f = paired_ratio(m, key)
        return f"{x:.2f}x [{x / f:.2f}, {x * f:.2f}]" if f > 1 else f"{x:.2f}x"

    for name, m in r["specserve"].items():
        cells = []
        for s in sets:
            rate = statistics.median(m[s]["rates"])
            same = sum(a == b for a, b in zip(m[s]["tokens"], reg[s]["tokens"]))
            ttft = statistics.median(m[s]["ttft"]) if m[s].get("ttft") else float("nan")
            cells.append(f"{rate:.1f} | {ratio(m[s], 'rates')} | {ratio(m[s], 'e2e') if 'e2e' in m[s] else '-'} | "
                         f"{ttft:.2f} | {same}/{len(reg[s]['tokens'])}")
        st = m.get("stats") or {}
        fmt = lambda v: "-" if v is None else f"{v:.2f}"
        steps = " / ".join(fmt(m[s].get("tokens_per_step")) for s in sets)
        lines.append(f"| specserve {name} | " + " | ".join(cells) + f" | {steps} | {fmt(st.get('c'))} | - |")
    lcpp = r.get("llamacpp_regular")
    def peer(rates: dict) -> str:  # a peer's decode rate and its ratio to specserve's regular decoding
        return " | ".join(f"{statistics.median(rates[s]):.1f} | "
                          f"{statistics.median(rates[s]) / statistics.median(reg[s]['rates']):.2f}x | - | - | -" for s in sets)

    if lcpp:
        lines.append("| llama.cpp regular (llama-cpp-python) | " + peer(lcpp) + " | - | - | - |")
    for point, m in (r.get("llamacpp_spec") or {}).items():
        acc = [a for s in sets for a in m[s]["acceptance"] if a is not None]
        lines.append(f"| llama.cpp speculative, draft n-max:n-min:p-min {point} | " + peer({s: m[s]["rates"] for s in sets})
                     + f" | - | - | {statistics.mean(acc) if acc else float('nan'):.2f} |")
    if r.get("llamacpp_spec"):
        lines += [""]
        for s in sets:
            best_ours = max((statistics.median(m[s]["rates"]), n) for n, m in r["specserve"].items() if n != "regular")
            best_lcpp = max((statistics.median(m[s]["rates"]), p) for p, m in r["llamacpp_spec"].items())
            lines.append(f"- {s}: specserve's best ({best_ours[1]}, {best_ours[0]:.1f} tok/s) is "
                         f"{best_ours[0] / best_lcpp[0]:.2f}x llama.cpp's best speculative ({best_lcpp[1]}, {best_lcpp[0]:.1f} tok/s)")
    for name, m in r["specserve"].items():
        low = {s: m[s]["lower_stage"] for s in sets if "lower_stage" in m[s]}
        if low:
            lines.append(f"- {name}: the draft kept its lower stage's proposals at " + ", ".join(
                f"{v['alpha']:.2f} on {s} ({v['k']:.2f} proposals per draft pass)" for s, v in low.items())
                + " (means over the prompts)")
        if "vocab_coverage" in m:
            lines.append(f"- {name}: the reduced head's {r['draft_vocab']} tokens hold {m['vocab_coverage']:.1%} of "
                         "regular decoding's output tokens")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--draft-model", default="qwen2.5-coder-0.5b")
    p.add_argument("--activations", default="int8", choices=["fp32", "int8"])
    p.add_argument("--humaneval", type=int, default=6, help="HumanEval problems (from the 20th: held out of drafts' data)")
    p.add_argument("--per-category", type=int, default=1, help="beyond-code prompts per category")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--methods", default="regular,suffix,draft,draft-fr,staged,staged-fr,auto-fr")
    p.add_argument("--draft-vocab", type=int, default=32768)
    p.add_argument("--llamacpp-grid", default="16:0:0.75,8:0:0.5,4:0:0.0",
                   help="llama.cpp's --spec-draft-n-max:n-min:p-min points ('' : none)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results"))
    args = p.parse_args()
    args.methods = [m for m in args.methods.split(",") if m]
    if args.methods[0] != "regular":
        args.methods.insert(0, "regular")
    args.llamacpp_grid = [g for g in args.llamacpp_grid.split(",") if g]
    target, draft = resolve_model_path(args.model), resolve_model_path(args.draft_model)
    tok_llm = LLM(target, kv_cache_gib=0.05)
    problems = humaneval_problems()[20:20 + args.humaneval]
    ids = {"humaneval": [chat_prompt(tok_llm, pr) for pr in problems],
           "beyond code": [tok_llm.tokenizer.encode(tok_llm.tokenizer.apply_chat_template(c), add_special_tokens=False)
                           for _, c in conversations(args.per_category)]}
    texts = {s: [tok_llm.tokenizer.decode(x, skip_special_tokens=False) for x in v] for s, v in ids.items()}
    del tok_llm
    result = {"model": os.path.basename(target), "draft": os.path.basename(draft), "machine": cpu(), "threads": args.threads,
              "activations": args.activations, "max_tokens": args.max_tokens, "draft_vocab": args.draft_vocab,
              "n": {s: len(v) for s, v in ids.items()}, "sets": list(ids), "command": "python bench/pair_spec.py " +
              " ".join(f"--{k.replace('_', '-')} {v if not isinstance(v, list) else ','.join(v)}" for k, v in vars(args).items()
                       if k not in ("out",))}
    result["specserve"] = run_specserve(args, ids, draft)
    if peers.llama_cpp_available():
        runs = {s: peers.llama_cpp_runs(target, args.threads, v, args.max_tokens) for s, v in ids.items()}
        if all(runs.values()):
            result["llamacpp_regular"] = {s: [1e3 / x["decode_ms_per_step"] for x in v] for s, v in runs.items()}
    if args.llamacpp_grid and os.path.exists(LLAMA_SPEC):
        result["llamacpp_spec"] = run_llamacpp_spec(args, texts, target, draft)
    elif args.llamacpp_grid:
        print("llama.cpp speculative: not built (make llamacpp-spec); left out")
    write_results(result, args.out, "pair-spec", markdown, lambda r, path: None)


if __name__ == "__main__":
    main()
