"""`specserve bench spec`, the draft-shape part: chains vs token trees vs the engine's automatic choice,
on HumanEval and on prompts beyond code (chat, summarisation, translation, math, QA through the chat
template: bench/prompts.py), greedy, batch sizes 1..16, each against regular decoding (RD) in the same
rounds; and configurations a user might force (PAD attention, trees, prompt lookup, a long fixed
draft), which the cost model must keep within 5% of RD. Per cell: tokens/s and the speedup with its
95% interval over rounds, tokens per target step, acceptance by draft position (by depth for trees),
tree spans and their mean nodes; at batch 1 also acceptance per prompt category.
"""
from __future__ import annotations

from specserve.engine.llm import LLM
from specserve.types import SamplingParams

from .prompts import conversations

SHAPES = {  # what the shape comparison runs (the engine's default cost-model fallback on)
    "draft chain": dict(method="draft", shape="chain"),
    "draft tree": dict(method="draft", shape="tree"),
    "draft auto": dict(method="draft", shape="auto"),
    "lookup+draft auto": dict(method="lookup+draft", shape="auto"),
}
FORCED = {  # settings a user may force; the fallback must keep each within 5% of RD
    "draft, attention pad": dict(method="draft", attention="pad"),
    "draft, tree": dict(method="draft", shape="tree"),
    "draft, fixed k=8": dict(method="draft", policy="fixed", draft_len=8),
    "lookup": dict(method="lookup"),
}
WITHIN = 0.95  # "never more than 5% slower than regular decoding"
TREE_SIZES = {  # batch 1, fallback off: how many tokens a target step can verify, and at what speed
    "chain (BASS)": dict(method="draft", shape="chain"),
    "tree 4x4, 15 nodes": dict(method="draft", shape="tree"),
    "tree 4x4, 31 nodes": dict(method="draft", shape="tree", tree_max_nodes=31),
    "tree 8x4, 63 nodes": dict(method="draft", shape="tree", tree_top_k=8, tree_max_nodes=63),
    "lookup+draft tree 4x4, 31 nodes": dict(method="lookup+draft", shape="tree", tree_max_nodes=31),
}


def prompt_sets(llm: LLM, problems: list[dict], per_category: int) -> dict[str, list[dict]]:
    """{"humaneval": [{"prompt": text}], "beyond code": [{"prompt": token ids, "category": ...}]}."""
    enc = lambda conv: llm.tokenizer.encode(llm.tokenizer.apply_chat_template(conv), add_special_tokens=False)
    return {"humaneval": [{"prompt": p["prompt"], "category": "code"} for p in problems],
            "beyond code": [{"prompt": enc(c), "category": cat} for cat, c in conversations(per_category)]}


def _per_category(llm: LLM, prompts: list[dict], params: SamplingParams) -> dict:
    """Batch 1, one pass over the prompts: drafts accepted per verify step and acceptance per category."""
    out: dict[str, list[int]] = {}
    for p in prompts:
        o = llm.generate(p["prompt"], params)[0].outputs[0]
        acc = out.setdefault(p["category"], [0, 0, 0, 0])  # accepted, drafted, verify steps, tokens
        acc[0] += sum(o.accepted_per_step or [])
        acc[1] += sum(o.drafted_per_step or [])
        acc[2] += len(o.accepted_per_step or [])
        acc[3] += len(o.token_ids)
    return {c: {"acceptance_rate": round(a / d, 3) if d else None, "accepted_per_verify_step": round(a / s, 3) if s else None,
                "verify_steps_per_token": round(s / t, 3)} for c, (a, d, s, t) in out.items()}


def run(compare, rd: LLM, common: dict, problems: list[dict], batch_sizes: list[int], rounds, max_tokens: int,
        bar, per_category: int = 8, forced: bool = True) -> dict:
    """compare: spec._compare (RD and a configuration on the same batches, interleaved)."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    sets = prompt_sets(rd, problems, per_category)
    result: dict = {"shapes": {}, "forced": {}, "categories": {}}
    for set_name, prompts in sets.items():
        for name, cfg in SHAPES.items():
            llm = LLM(**common, speculative=cfg)
            llm.generate(prompts[0]["prompt"], SamplingParams(temperature=0, max_tokens=8))
            rows = []
            for b in batch_sizes:
                row = compare(rd, llm, prompts, b, rounds(b), params, bar)
                st = llm.spec_stats()
                row.update(tree_spans=st["tree_spans"], mean_tree_nodes=st["mean_tree_nodes"] and round(st["mean_tree_nodes"], 2),
                           acceptance_by_depth=[round(a, 3) for a in st["acceptance_by_position"][:8]])
                rows.append(row)
            result["shapes"].setdefault(set_name, {})[name] = rows
            if set_name == "beyond code":
                llm.reset_spec_stats()
                result["categories"][name] = _per_category(llm, prompts, params)
            del llm
    if forced:
        for name, cfg in FORCED.items():
            llm = LLM(**common, speculative=cfg)
            llm.generate(problems[0]["prompt"], SamplingParams(temperature=0, max_tokens=8))
            result["forced"][name] = {set_name: [compare(rd, llm, prompts, b, rounds(b), params, bar) for b in batch_sizes]
                                      for set_name, prompts in sets.items()}
            del llm
    return result


def run_tree_sizes(compare, rd: LLM, common: dict, problems: list[dict], rounds: int, max_tokens: int, bar,
                   per_category: int = 8) -> dict:
    """Batch 1 with the cost-model fallback off (every step drafts, nothing cut): tokens per target step
    and tok/s against RD as trees grow, on both prompt sets."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    out: dict = {}
    for set_name, prompts in prompt_sets(rd, problems, per_category).items():
        for name, cfg in TREE_SIZES.items():
            llm = LLM(**common, speculative={**cfg, "fallback": False})
            llm.generate(prompts[0]["prompt"], SamplingParams(temperature=0, max_tokens=8))
            row = compare(rd, llm, prompts, 1, rounds, params, bar)
            st = llm.spec_stats()
            row.update(tree_spans=st["tree_spans"], mean_tree_nodes=st["mean_tree_nodes"] and round(st["mean_tree_nodes"], 2),
                       acceptance_by_depth=[round(a, 3) for a in st["acceptance_by_position"][:8]])
            out.setdefault(set_name, {})[name] = row
            del llm
    return out


def cells(batch_sizes: list[int], sets: int = 2, forced: bool = True) -> int:
    """How many (configuration, prompt set, batch size) comparisons `run` makes (for the progress bar)."""
    return (len(SHAPES) + (len(FORCED) if forced else 0)) * sets * len(batch_sizes)


def markdown(r: dict) -> list[str]:
    lines = ["## draft shapes: chains, token trees and the automatic choice (greedy, cost-model fallback on)", "",
             "tok/s ratio = speculative / RD tokens per wall second in the same rounds (95% interval over rounds); "
             "tokens/step counts plain steps too; acceptance by draft position (by depth for trees).", ""]
    for set_name, configs in r["shapes"].items():
        lines += [f"### {set_name}", "", "| config | batch | RD tok/s | spec tok/s | ratio (95% interval) | tokens/step "
                  "| tree spans, mean nodes | acceptance by depth | identical |", "|" + "---|" * 9]
        for name, rows in configs.items():
            for t in rows:
                ci = "-".join(f"{x:.2f}" for x in t["speedup_95ci"]["tokens_per_s"])
                lines.append(f"| {name} | {t['batch']} | {t['rd']['tokens_per_s']} | {t['spec']['tokens_per_s']} "
                             f"| {t['speedup']['tokens_per_s']}x ({ci}) | {t['tokens_per_target_step']} "
                             f"| {t['tree_spans']}, {t['mean_tree_nodes']} | {t['acceptance_by_depth']} | {t['identical_to_rd']} |")
        lines.append("")
    if r["categories"]:
        lines += ["### beyond code, per category (batch 1): acceptance rate / drafts accepted per verify step", "",
                  "| config | " + " | ".join(next(iter(r["categories"].values()))) + " |",
                  "|" + "---|" * (1 + len(next(iter(r["categories"].values()))))]
        for name, cats in r["categories"].items():
            lines.append(f"| {name} | " + " | ".join(f"{c['acceptance_rate']} / {c['accepted_per_verify_step']}"
                                                     for c in cats.values()) + " |")
        lines.append("")
    if r["forced"]:
        lines += [f"### forced configurations (fallback on): tok/s ratio to RD by batch; must stay >= {WITHIN}", "",
                  "| config | prompts | " + " | ".join(f"batch {t['batch']}" for t in next(iter(r['forced'].values()))['humaneval'])
                  + " | worst |", "|" + "---|" * (3 + len(next(iter(r['forced'].values()))['humaneval']))]
        for name, sets in r["forced"].items():
            for set_name, rows in sets.items():
                ratios = [t["speedup"]["tokens_per_s"] for t in rows]
                lines.append(f"| {name} | {set_name} | " + " | ".join(f"{x}x" for x in ratios)
                             + f" | {min(ratios)}x {'ok' if min(ratios) >= WITHIN else 'BELOW'} |")
        lines.append("")
    return lines


def markdown_tree_sizes(r: dict) -> list[str]:
    lines = ["## tree sizes (greedy, batch 1, cost-model fallback off: every step drafts, nothing is cut)", "",
             "| prompts | config | tokens/step | mean nodes | acceptance by depth | tok/s RD -> spec | ratio (95% interval) "
             "| identical |", "|" + "---|" * 8]
    for set_name, configs in r.items():
        for name, t in configs.items():
            ci = "-".join(f"{x:.2f}" for x in t["speedup_95ci"]["tokens_per_s"])
            lines.append(f"| {set_name} | {name} | {t['tokens_per_target_step']} | {t['mean_tree_nodes']} | {t['acceptance_by_depth']} "
                         f"| {t['rd']['tokens_per_s']} -> {t['spec']['tokens_per_s']} | {t['speedup']['tokens_per_s']}x ({ci}) "
                         f"| {t['identical_to_rd']} |")
    return lines + [""]


def plot(r: dict, ax_row) -> None:
    """Tok/s ratio to RD by batch size, one panel per prompt set, one line per configuration."""
    for ax, (set_name, configs) in zip(ax_row, r["shapes"].items()):
        for name, rows in configs.items():
            b = [t["batch"] for t in rows]
            ax.plot(b, [t["speedup"]["tokens_per_s"] for t in rows], marker="o", label=name)
        ax.axhline(1.0, color="grey", lw=1)
        ax.axhline(WITHIN, color="grey", lw=1, ls=":")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_ylabel("tok/s vs regular decoding")
        ax.set_title(f"draft shapes, greedy: {set_name}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
