"""`specserve bench prefix`: what prefix caching saves, side by side in one run.

Two engines on the same weights, one with prefix caching and one without, take turns round by round
(the machine's speed drifts). Each round:
  - multi-turn chat: a long system prompt (about --prefix-tokens tokens of the standard library's
    documentation) and a question, answered; then a second turn (the first turn, its answer and a new
    question): time to first token of the second turn, whose prefix the first turn computed;
  - shared system prompt: --shared more questions with the same system prompt, one after another:
    their time to first token.
Each round asks other questions, so only the system prompt (and within a round the first turn) can
come from the cache. Greedy outputs are compared request for request: prefix caching must not
change a token."""
from __future__ import annotations

import statistics
import time

from tqdm.auto import tqdm

from specserve.cli.engine_args import llm_kwargs
from specserve.engine.llm import LLM
from specserve.types import SamplingParams

from .machine import cpu
from .output import write_results

QUESTIONS = [
    ("Which function in this text parses arguments?", "What does it return?"),
    ("Summarise the first paragraph in one sentence.", "Now say it in French."),
    ("Name one class the text mentions.", "Why would someone use it?"),
    ("Is this documentation for a command line tool?", "Give an example command."),
    ("What is the main topic here?", "List two related topics."),
    ("Who would read this text?", "What would they learn first?"),
    ("Pick one keyword from the text.", "Explain it simply."),
    ("What would you rename in this text?", "Why?"),
]
EXTRA = ["What is an option?", "What is a subcommand?", "How are errors reported?", "What is a default value?",
         "What is a positional argument?", "What does help print?", "Is there a version flag?", "What is a namespace?"]


def system_prompt(tokenizer, num_tokens: int) -> str:
    """About num_tokens tokens of the standard library's documentation (argparse, then others)."""
    import argparse
    import collections
    import json as json_module
    import pydoc
    text, out = "", []
    for mod in (argparse, collections, json_module):
        for line in pydoc.render_doc(mod, renderer=pydoc.plaintext).splitlines():
            out.append(line)
            if len(out) % 20 == 0 and len(tokenizer.encode("\n".join(out), add_special_tokens=False)) >= num_tokens:
                return "Answer questions about this documentation.\n\n" + "\n".join(out)
        text = "\n".join(out)
    return "Answer questions about this documentation.\n\n" + text


def run_prefix_bench(args) -> dict:
    engines = {"cached": LLM(**llm_kwargs(args, enable_prefix_caching=True)),
               "uncached": LLM(**llm_kwargs(args, enable_prefix_caching=False))}
    tok = engines["cached"].tokenizer
    system = system_prompt(tok, args.prefix_tokens)
    greedy = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    for llm in engines.values():  # warm-up: kernels, allocator (short: caches nothing of the bench's prompts)
        llm.chat([{"role": "user", "content": "Hi"}], SamplingParams(temperature=0, max_tokens=4))
    per = {name: {"turn2_ttft": [], "turn1_ttft": [], "shared_ttft": [], "cached_tokens": [], "prompt_tokens": [],
                  "outputs": []} for name in engines}
    bar = tqdm(total=args.rounds * len(engines), desc="prefix bench")
    for i in range(args.rounds):
        q1, q2 = QUESTIONS[i % len(QUESTIONS)]
        for name in (("cached", "uncached") if i % 2 == 0 else ("uncached", "cached")):
            llm, acc = engines[name], per[name]
            turn1 = [{"role": "system", "content": system}, {"role": "user", "content": f"{q1} (round {i})"}]
            o1 = llm.chat(turn1, greedy)[0]
            turn2 = turn1 + [{"role": "assistant", "content": o1.outputs[0].text}, {"role": "user", "content": q2}]
            o2 = llm.chat(turn2, greedy)[0]
            acc["turn1_ttft"].append(o1.outputs[0].time_to_first_token)
            acc["turn2_ttft"].append(o2.outputs[0].time_to_first_token)
            acc["cached_tokens"].append(o2.num_cached_tokens)
            acc["prompt_tokens"].append(len(o2.prompt_token_ids))
            acc["outputs"] += [o1.outputs[0].token_ids, o2.outputs[0].token_ids]
            for q in EXTRA[:args.shared]:
                o = llm.chat([{"role": "system", "content": system}, {"role": "user", "content": f"{q} (round {i})"}], greedy)[0]
                acc["shared_ttft"].append(o.outputs[0].time_to_first_token)
                acc["outputs"].append(o.outputs[0].token_ids)
            bar.update()
    bar.close()
    c, u = per["cached"], per["uncached"]
    med = lambda xs: round(statistics.median(xs), 4)  # noqa: E731
    result = {
        "cpu": cpu(), "rounds": args.rounds, "prefix_tokens": len(tok.encode(system, add_special_tokens=False)),
        "max_tokens": args.max_tokens, "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "turn2_prompt_tokens": med(c["prompt_tokens"]), "turn2_cached_tokens": med(c["cached_tokens"]),
        "ttft_s": {name: {k: med(per[name][k]) for k in ("turn1_ttft", "turn2_ttft", "shared_ttft") if per[name][k]}
                   for name in per},
        "identical_outputs": c["outputs"] == u["outputs"],
    }
    result["turn2_ttft_ratio"] = round(med(u["turn2_ttft"]) / med(c["turn2_ttft"]), 2)
    if c["shared_ttft"]:
        result["shared_ttft_ratio"] = round(med(u["shared_ttft"]) / med(c["shared_ttft"]), 2)
    return write_results(result, args.out, "prefix", _markdown, _plot)


def _markdown(r: dict) -> str:
    t = r["ttft_s"]
    lines = [f"# Prefix caching: time to first token with and without, {r['rounds']} rounds, medians", "",
             f"CPU: {r['cpu']['cpu']}, flags {', '.join(r['cpu']['flags'])}; system prompt {r['prefix_tokens']} tokens; "
             f"second turn {r['turn2_prompt_tokens']:.0f} prompt tokens, {r['turn2_cached_tokens']:.0f} of them from the cache", "",
             "| request | without cache s | with cache s | ratio |", "|---|---|---|---|"]
    for key, label in (("turn1_ttft", "first turn (system prompt cached from earlier rounds)"),
                       ("turn2_ttft", "second turn (shares the first turn)"), ("shared_ttft", "same system prompt, new question")):
        if key in t["cached"]:
            lines.append(f"| {label} | {t['uncached'][key]} | {t['cached'][key]} | "
                         f"{round(t['uncached'][key] / t['cached'][key], 2)}x |")
    lines += ["", f"- greedy outputs identical with and without the cache: **{r['identical_outputs']}**", ""]
    return "\n".join(lines)


def _plot(r: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t = r["ttft_s"]
    keys = [k for k in ("turn1_ttft", "turn2_ttft", "shared_ttft") if k in t["cached"]]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = range(len(keys))
    ax.bar([x - 0.2 for x in xs], [t["uncached"][k] for k in keys], 0.4, label="without prefix cache")
    ax.bar([x + 0.2 for x in xs], [t["cached"][k] for k in keys], 0.4, label="with prefix cache")
    ax.set_xticks(list(xs), [k.replace("_ttft", "") for k in keys])
    ax.set_ylabel("time to first token, s (median)")
    ax.set_title(f"Prefix caching, {r['prefix_tokens']}-token system prompt")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
