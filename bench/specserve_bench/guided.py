"""`specserve bench guided`: guided generation's validity and speed on the bench's JSON Schemas (flat,
enums, arrays, nested, string formats; bench/guided_set.py), batch 1, through the chat template.

Configurations, run in turn prompt by prompt in the same run (the machine's speed drifts):
  unconstrained | constrained (masks only) | constrained + fast-forward | + speculation, and
  unconstrained + speculation (what speculation gives without a grammar).
Reported: validity (jsonschema, with format checks), tokens/s, time per sampled token (tokens the
model had to choose: fast-forwarded ones are free), the share of fast-forwarded tokens; greedy and
sampled (T = 1, seeded). Then the grammar engines side by side: compile time per schema and mask
time per token, llguidance vs xgrammar (where installed), replaying the constrained outputs' tokens."""
from __future__ import annotations

import json
import time
from typing import Optional

from tqdm.auto import tqdm

from specserve.cli.engine_args import llm_kwargs
from specserve.engine.llm import LLM
from specserve.types import SamplingParams

from .guided_set import SCHEMAS
from .machine import cpu
from .output import write_results

CONFIGS = ("unconstrained", "constrained", "constrained+ff", "constrained+ff+spec", "unconstrained+spec")


def _invalid(text: str, schema: dict) -> Optional[str]:
    """Why text is not valid against schema (None: valid)."""
    import jsonschema
    try:
        jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.FormatChecker())
        return None
    except (ValueError, jsonschema.ValidationError) as e:
        return str(e).splitlines()[0][:200]


def _engines(args) -> dict:
    spec = {"method": args.speculative, "fallback": True}
    plain, no_ff = LLM(**llm_kwargs(args)), LLM(**llm_kwargs(args, guided_fast_forward=False))
    specl = LLM(**llm_kwargs(args, speculative=spec))
    return {"unconstrained": (plain, False), "constrained": (no_ff, True), "constrained+ff": (plain, True),
            "constrained+ff+spec": (specl, True), "unconstrained+spec": (specl, False)}


def _check_canonical(tok, o, acc: dict) -> None:
    """Each run of fast-forwarded tokens against the tokenizer's canonical tokenisation of its text
    (the grammar's tokens are what the output keeps either way; this counts where they differ)."""
    ids, origins, i = o.token_ids, o.origins, 0
    while i < len(ids):
        if origins[i] != "grammar":
            i += 1
            continue
        j = i
        while j < len(ids) and origins[j] == "grammar":
            j += 1
        run = list(ids[i:j])
        text = tok.decode(run)
        canon = tok.encode(text, add_special_tokens=False)
        acc["runs"] += 1
        acc["tokens"] += len(run)
        if canon != run:
            acc["differ"] += 1
            if len(acc["examples"]) < 5:
                acc["examples"].append({"text": text, "grammar": run, "canonical": canon})
        i = j


def run_guided_bench(args) -> dict:
    engines = _engines(args)
    base = engines["unconstrained"][0]
    tok = base.tokenizer
    runs = {c: {"tokens": 0, "sampled": 0, "seconds": 0.0, "valid": 0, "outputs": 0} for c in CONFIGS}
    per_schema: dict[str, dict] = {}
    replays: list[tuple[dict, list[int]]] = []  # (schema, constrained output tokens) for the engines' timing
    invalid: list[dict] = []
    canonical = {"runs": 0, "tokens": 0, "differ": 0, "examples": []}  # forced runs vs the tokenizer's own tokens
    settings = [("greedy", None)] + [("T=1", s) for s in range(args.samples)]
    for llm, _ in engines.values():  # warm up every engine (kernels, the grammar's tokenizer)
        llm.generate("Hi", SamplingParams(temperature=0, max_tokens=4, guided_json=SCHEMAS[0][1]))
    schemas = SCHEMAS[:args.schemas]
    bar = tqdm(total=len(schemas) * len(settings) * len(CONFIGS) * args.rounds, desc="guided bench")
    for _ in range(args.rounds):
        for name, schema, ask in schemas:
            prompt = tok.apply_chat_template([{"role": "user", "content": ask}])
            row = per_schema.setdefault(name, {c: {"tokens": 0, "seconds": 0.0, "valid": 0, "outputs": 0} for c in CONFIGS})
            for setting, seed in settings:
                for config in CONFIGS:
                    llm, guided = engines[config]
                    params = SamplingParams(temperature=0 if seed is None else 1.0, seed=seed, max_tokens=args.max_tokens,
                                            guided_json=schema if guided else None)
                    t0 = time.perf_counter()
                    o = llm.generate(prompt, params)[0].outputs[0]
                    dt = time.perf_counter() - t0
                    forced = o.origins.count("grammar")
                    why = _invalid(o.text, schema)
                    if why and guided:  # kept for the note: a constrained output that fails its schema
                        invalid.append({"config": config, "schema": name, "setting": setting, "finish_reason": o.finish_reason,
                                        "why": why, "text": o.text[-200:]})
                    for acc in (runs[config], row[config]):
                        acc["tokens"] += len(o.token_ids)
                        acc["seconds"] += dt
                        acc["outputs"] += 1
                        acc["valid"] += why is None
                    runs[config]["sampled"] += len(o.token_ids) - forced
                    if config == "constrained+ff" and setting == "greedy":
                        replays.append((schema, list(o.token_ids)))
                    if config == "constrained+ff":
                        _check_canonical(tok, o, canonical)
                    bar.update()
    bar.close()
    result = {"cpu": cpu(), "speculative": args.speculative, "max_tokens": args.max_tokens, "rounds": args.rounds,
              "samples_per_schema": args.samples, "configs": {}, "per_schema": {}, "engines": grammar_engines(tok, replays),
              "invalid_constrained": invalid, "forced_canonical": canonical}
    for c, r in runs.items():
        result["configs"][c] = {"tokens_per_s": round(r["tokens"] / r["seconds"], 2), "validity": round(r["valid"] / r["outputs"], 3),
                                "ms_per_sampled_token": round(1000 * r["seconds"] / max(r["sampled"], 1), 3),
                                "fast_forwarded_share": round(1 - r["sampled"] / r["tokens"], 3) if r["tokens"] else 0.0,
                                "outputs": r["outputs"], "tokens": r["tokens"]}
    for name, row in per_schema.items():
        result["per_schema"][name] = {c: {"tokens_per_s": round(v["tokens"] / v["seconds"], 2),
                                          "validity": round(v["valid"] / v["outputs"], 3)} for c, v in row.items()}
    cfg = result["configs"]
    result["ratios"] = {
        "fast_forward_speedup": round(cfg["constrained+ff"]["tokens_per_s"] / cfg["constrained"]["tokens_per_s"], 3),
        # masks' overhead per sampled token, fast-forward off (each token sampled either way)
        "constrained_overhead_per_sampled_token": round(cfg["constrained"]["ms_per_sampled_token"]
                                                        / cfg["unconstrained"]["ms_per_sampled_token"] - 1, 3),
        "spec_speedup_constrained": round(cfg["constrained+ff+spec"]["tokens_per_s"] / cfg["constrained+ff"]["tokens_per_s"], 3),
        "spec_speedup_unconstrained": round(cfg["unconstrained+spec"]["tokens_per_s"] / cfg["unconstrained"]["tokens_per_s"], 3),
    }
    return write_results(result, args.out, "guided", markdown, plot)


def grammar_engines(tokenizer, replays: list[tuple[dict, list[int]]]) -> dict:
    """Compile time per schema and mask time per token, llguidance vs xgrammar (where it imports),
    over the same token sequences, both with the engine's compact JSON (json.dumps's separators)."""
    import llguidance
    import llguidance.torch as lt

    from specserve.guided.grammar import json_grammar
    t0 = time.perf_counter()
    lltok = llguidance.LLTokenizer(tokenizer.backend.to_str(), n_vocab=tokenizer.vocab_size, eos_token=tokenizer.eos_token_ids[0])
    out: dict[str, Optional[dict]] = {"llguidance": _replay(
        replays, time.perf_counter() - t0, lambda schema: llguidance.LLMatcher(lltok, json_grammar(schema), log_level=0),
        lambda: lt.allocate_token_bitmask(1, lltok.vocab_size), lambda m, bm: lt.fill_next_token_bitmask(m, bm, 0),
        lambda m, t: m.consume_token(t))}
    try:
        import xgrammar as xgr
    except ImportError:
        out["xgrammar"] = None
        return out
    t0 = time.perf_counter()
    info = xgr.TokenizerInfo([tokenizer.backend.id_to_token(i) or "" for i in range(tokenizer.vocab_size)],
                             xgr.VocabType.BYTE_LEVEL, stop_token_ids=tokenizer.eos_token_ids)
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    out["xgrammar"] = _replay(
        replays, time.perf_counter() - t0,
        lambda schema: xgr.GrammarMatcher(compiler.compile_json_schema(json.dumps(schema), any_whitespace=False,
                                                                       separators=(", ", ": "))),
        lambda: xgr.allocate_token_bitmask(1, info.vocab_size), lambda m, bm: m.fill_next_token_bitmask(bm, 0),
        lambda m, t: m.accept_token(t))
    return out


def _replay(replays, setup_s: float, matcher, bitmask, fill, accept) -> dict:
    """Time one engine: matcher(schema) (the compile), then fill(m, bm) before each token accept(m, t)."""
    compile_s, mask_s, n = 0.0, 0.0, 0
    for schema, tokens in replays:
        t0 = time.perf_counter()
        m = matcher(schema)
        compile_s += time.perf_counter() - t0
        bm = bitmask()
        for t in tokens:
            t0 = time.perf_counter()
            fill(m, bm)
            mask_s += time.perf_counter() - t0
            n += 1
            if not accept(m, t):
                break
    return {"tokenizer_setup_s": round(setup_s, 3), "compile_ms_per_schema": round(1000 * compile_s / max(len(replays), 1), 3),
            "mask_ms_per_token": round(1000 * mask_s / max(n, 1), 4), "tokens": n}


def markdown(r: dict) -> str:
    c = r["cpu"]
    lines = [f"# Guided generation: {len(r['per_schema'])} JSON Schemas, batch 1, greedy + {r['samples_per_schema']} samples at T=1 each, "
             f"{r['rounds']} round(s)", "",
             f"CPU: {c['cpu']}, flags {', '.join(c['flags']) or 'none of avx2/avx512f/amx_tile'}; "
             f"speculation: {r['speculative']} (fallback on)", "",
             "| configuration | tokens/s | ms per sampled token | fast-forwarded | valid |", "|---|---|---|---|---|"]
    for name, v in r["configs"].items():
        lines.append(f"| {name} | {v['tokens_per_s']} | {v['ms_per_sampled_token']} | {100 * v['fast_forwarded_share']:.1f}% "
                     f"| {100 * v['validity']:.0f}% of {v['outputs']} |")
    q = r["ratios"]
    lines += ["", f"- fast-forward: **{q['fast_forward_speedup']}x** constrained tokens/s",
              f"- masks' overhead per sampled token (fast-forward off): **{100 * q['constrained_overhead_per_sampled_token']:+.1f}%**",
              f"- speculation: {q['spec_speedup_constrained']}x constrained (with fast-forward) vs "
              f"{q['spec_speedup_unconstrained']}x unconstrained", "", "Per schema (tokens/s, validity):", "",
              "| schema | " + " | ".join(CONFIGS) + " |", "|---|" + "---|" * len(CONFIGS)]
    for name, row in r["per_schema"].items():
        lines.append(f"| {name} | " + " | ".join(f"{row[c]['tokens_per_s']} ({100 * row[c]['validity']:.0f}%)" for c in CONFIGS) + " |")
    fc = r.get("forced_canonical")
    if fc and fc["runs"]:
        lines.append(f"- fast-forwarded runs whose tokens differ from the tokenizer's canonical tokenisation of their "
                     f"text: {fc['differ']} of {fc['runs']} ({fc['tokens']} forced tokens; the grammar's tokens are kept)")
    for bad in r["invalid_constrained"]:
        lines.append(f"- invalid constrained output ({bad['config']}, {bad['schema']}, {bad['setting']}, "
                     f"finish {bad['finish_reason']}): {bad['why']}")
    lines += ["", "Grammar engines (the constrained + fast-forward greedy outputs replayed):", "",
              "| engine | tokenizer setup s | compile ms per schema | mask ms per token |", "|---|---|---|---|"]
    for name, e in r["engines"].items():
        lines.append(f"| {name} | " + (" | ".join(str(e[k]) for k in ("tokenizer_setup_s", "compile_ms_per_schema", "mask_ms_per_token"))
                                     if e else "not installed | | ") + " |")
    return "\n".join(lines) + "\n"


def plot(r: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(r["per_schema"])
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(CONFIGS)
    for i, config in enumerate(CONFIGS):
        ax.bar([j + i * width for j in range(len(names))], [r["per_schema"][n][config]["tokens_per_s"] for n in names],
               width, label=config)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names)
    ax.set_ylabel("tokens/s (batch 1)")
    ax.set_title(f"Guided generation by schema ({r['cpu']['cpu']})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
