"""`specserve bench sarathi`: decode-maximal batching with chunked prefill (SARATHI) against
whole-prompt prefill, side by side in one run.

Each round, per engine (the engines take turns; the machine's speed drifts): --decoders short chat
requests decode (--max-tokens each, EOS ignored) while --long prompts of about --long-tokens tokens
arrive at fixed times after the start. The step loop runs in this process, and the time of every
token is taken when its step returns. Reported: the decoders' inter-token latency (p50, p99, max) and
time per output token (p50, p99 over requests), and the long prompts' time to first token. Whole-prompt
prefill runs a long prompt in one pass, and every running decode waits for it; chunked prefill runs the
chunk measured at start (speculative/calibration.py) beside the decodes.
"""
from __future__ import annotations

import statistics
import time

from tqdm.auto import tqdm

from specserve.cli.engine_args import llm_kwargs
from specserve.engine.llm import LLM
from specserve.types import SamplingParams

from .machine import cpu
from .output import write_results
from .prefix import system_prompt

QUESTIONS = ["Tell me about the sea.", "Describe a forest at night.", "Explain how a bicycle works.",
             "Write about a quiet morning.", "What makes a good friend?", "Describe a busy market.",
             "How do birds fly?", "Tell a story about a robot."]


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def _one_round(llm: LLM, decoders: list[list[int]], longs: list[list[int]], arrivals: list[float], max_tokens: int,
               limit_s: float) -> dict:
    eng = llm.engine
    dec_params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    long_params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    t0 = time.perf_counter()
    dec = [eng.add_request(p, dec_params)[0] for p in decoders]
    last: dict[str, tuple[float, int]] = {}  # decoder id -> (time of its last token, tokens so far)
    gaps: list[float] = []
    pending = sorted(zip(arrivals, longs))
    long_reqs = []
    steps = 0
    while (eng.has_unfinished() or pending) and time.perf_counter() - t0 < limit_s and steps < 20000:
        now = time.perf_counter() - t0
        while pending and pending[0][0] <= now:
            long_reqs.append(eng.add_request(pending.pop(0)[1], long_params)[0])
        if not eng.has_unfinished():
            time.sleep(0.001)
            continue
        eng.step()
        steps += 1
        now = time.perf_counter()
        for r in dec:
            n = len(r.output_token_ids)
            prev = last.get(r.request_id)
            if prev is not None and n > prev[1]:
                gaps += [(now - prev[0]) / (n - prev[1])] * (n - prev[1])  # tokens of one step share its wait
            if prev is None or n > prev[1]:
                last[r.request_id] = (now, n)
    tpot = [(r.finish_time - r.first_token_time) / (len(r.output_token_ids) - 1) for r in dec
            if r.finish_time and len(r.output_token_ids) > 1]
    ttft = [r.first_token_time - r.arrival_time for r in long_reqs if r.first_token_time]
    return {"gaps": gaps, "tpot": tpot, "ttft": ttft, "steps": steps, "complete": not eng.has_unfinished()}


def run_sarathi_bench(args) -> dict:
    kw = lambda chunk: llm_kwargs(args, enable_prefix_caching=False, prefill_chunk=chunk)  # every round prefills in full
    engines = {"whole-prompt prefill": LLM(**kw(None)), "chunked (SARATHI)": LLM(**kw("auto"))}
    if args.chunk:
        engines[f"chunked {args.chunk}"] = LLM(**kw(args.chunk))
    tok = next(iter(engines.values())).tokenizer
    chat = lambda text: tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]),  # noqa: E731
                                   add_special_tokens=False)
    decoders = [chat(q) for q in QUESTIONS[:args.decoders]]
    doc = system_prompt(tok, args.long_tokens)
    for llm in engines.values():  # warm-up
        llm.generate(decoders[:1], SamplingParams(temperature=0, max_tokens=4))
    acc = {name: {"gaps": [], "tpot": [], "ttft": [], "steps": 0, "complete": True} for name in engines}
    bar = tqdm(total=args.rounds * len(engines), desc="sarathi bench")
    for i in range(args.rounds):
        # other long prompts each round (no engine state carries over), arriving while the decoders run
        longs = [chat(f"{doc}\n\nQuestion {i}.{j}: what is this about?") for j in range(args.long)]
        arrivals = [args.first_arrival + j * args.every for j in range(args.long)]
        names = list(engines) if i % 2 == 0 else list(reversed(engines))
        for name in names:
            got = _one_round(engines[name], decoders, longs, arrivals, args.max_tokens, args.limit_s)
            for k in ("gaps", "tpot", "ttft"):
                acc[name][k] += got[k]
            acc[name]["steps"] += got["steps"]
            acc[name]["complete"] &= got["complete"]
            bar.update()
    bar.close()
    result = {"cpu": cpu(), "rounds": args.rounds, "decoders": args.decoders, "max_tokens": args.max_tokens,
              "long_prompts": args.long, "long_prompt_tokens": len(chat(doc)), "first_arrival_s": args.first_arrival,
              "every_s": args.every, "time": time.strftime("%Y-%m-%d %H:%M:%S"),
              "prefill_chunk": {name: llm.engine.prefill_chunk for name, llm in engines.items()}, "engines": {}}
    for name, a in acc.items():
        ms = lambda x: round(1000 * x, 1)  # noqa: E731
        result["engines"][name] = {
            "itl_p50_ms": ms(statistics.median(a["gaps"])), "itl_p99_ms": ms(_percentile(a["gaps"], 0.99)),
            "itl_max_ms": ms(max(a["gaps"])), "tpot_p50_ms": ms(statistics.median(a["tpot"])),
            "tpot_p99_ms": ms(_percentile(a["tpot"], 0.99)), "long_ttft_p50_s": round(statistics.median(a["ttft"]), 3),
            "long_ttft_max_s": round(max(a["ttft"]), 3), "steps": a["steps"], "complete": a["complete"]}
    whole, chunked = result["engines"]["whole-prompt prefill"], result["engines"]["chunked (SARATHI)"]
    result["itl_p99_ratio"] = round(whole["itl_p99_ms"] / chunked["itl_p99_ms"], 2)
    result["tpot_p99_ratio"] = round(whole["tpot_p99_ms"] / chunked["tpot_p99_ms"], 2)
    return write_results(result, args.out, "sarathi", _markdown, _plot)


def _markdown(r: dict) -> str:
    lines = [f"# Chunked prefill with decode-maximal batching (SARATHI) vs whole-prompt prefill, {r['rounds']} rounds", "",
             f"CPU: {r['cpu']['cpu']}, flags {', '.join(r['cpu']['flags'])}; {r['decoders']} decoders x {r['max_tokens']} "
             f"tokens while {r['long_prompts']} prompts of {r['long_prompt_tokens']} tokens arrive (from "
             f"{r['first_arrival_s']} s, every {r['every_s']} s); chunk: {r['prefill_chunk']}", "",
             "| prefill | ITL p50 ms | ITL p99 ms | ITL max ms | TPOT p50 ms | TPOT p99 ms | long prompts' TTFT p50 s | max s |",
             "|---|---|---|---|---|---|---|---|"]
    for name, e in r["engines"].items():
        lines.append(f"| {name} | {e['itl_p50_ms']} | {e['itl_p99_ms']} | {e['itl_max_ms']} | {e['tpot_p50_ms']} | "
                     f"{e['tpot_p99_ms']} | {e['long_ttft_p50_s']} | {e['long_ttft_max_s']} |")
    lines += ["", f"- p99 inter-token latency: whole-prompt / chunked = **{r['itl_p99_ratio']}x**; "
                  f"p99 time per output token: **{r['tpot_p99_ratio']}x**", ""]
    return "\n".join(lines)


def _plot(r: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(r["engines"])
    fig, ax = plt.subplots(figsize=(6.5, 3.5))
    xs = range(len(names))
    for off, key, label in ((-0.2, "itl_p50_ms", "ITL p50"), (0.2, "itl_p99_ms", "ITL p99")):
        ax.bar([x + off for x in xs], [r["engines"][n][key] for n in names], 0.4, label=label)
    ax.set_xticks(list(xs), names)
    ax.set_ylabel("decoders' inter-token latency, ms")
    ax.set_title(f"{r['long_prompts']} prompts of {r['long_prompt_tokens']} tokens arriving during decoding")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
