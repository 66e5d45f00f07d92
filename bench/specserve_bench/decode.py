"""`specserve bench decode`: regular decoding against HF transformers (fp32, bf16) and llama.cpp,
in one run, on the same weights and HumanEval prompts. Writes JSON + markdown under bench/results/."""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch
from tqdm.auto import tqdm

from specserve.cli.engine_args import llm_kwargs
from specserve.engine.llm import LLM
from specserve.types import SamplingParams

from . import peers
from .humaneval import humaneval_prompts

TEMPERATURE = 0.7
SEED = 1234


def _engine_run(llm: LLM, prompt_ids: list[int], max_new: int, batch: int) -> dict:
    if batch == 1:
        params = SamplingParams(temperature=0, max_tokens=max_new, ignore_eos=True)
    else:
        params = SamplingParams(n=batch, temperature=TEMPERATURE, seed=SEED, max_tokens=max_new, ignore_eos=True)
    t0 = time.perf_counter()
    out = llm.generate([prompt_ids], params)[0]
    wall = time.perf_counter() - t0
    tokens = sum(len(o.token_ids) for o in out.outputs)
    return {"ttft_s": out.metrics["time_to_first_token"], "decode_ms_per_step": out.metrics["per_token_latency"] * 1e3,
            "tokens_per_s": tokens / wall, "wall_s": wall, "tokens": tokens, "output_ids": out.outputs[0].token_ids}


def _same_until_eos(ours: list[int], theirs: list[int], eos_ids: list[int]) -> bool:
    """Greedy outputs agree up to the engine's first EOS. To time exactly max_new tokens the engine
    ignores EOS while HF is told min_new_tokens (which bans EOS), so they part ways there by design."""
    n = next((i for i, t in enumerate(ours) if t in eos_ids), len(ours))
    return ours[:n] == theirs[:n]


def _median_runs(runs: list[dict]) -> dict:
    keys = ("ttft_s", "decode_ms_per_step", "tokens_per_s")
    return {k: statistics.median(r[k] for r in runs) for k in keys}


# What a new process costs to load the model and answer (a child: the bench's own RSS holds the peers).
_LOAD_PROBE = """
import json, sys, time
t0 = time.perf_counter()
from specserve import LLM, SamplingParams
llm = LLM(sys.argv[1], kv_cache_gib=float(sys.argv[2]), num_threads=int(sys.argv[3]) or None, activations=sys.argv[4])
load = time.perf_counter() - t0
llm.generate(["def f(x):"], SamplingParams(temperature=0, max_tokens=16))
from specserve_bench.peers import peak_rss_mb
print(json.dumps({"load_s": load, "peak_rss_mb": peak_rss_mb()}))
"""


def load_probe(model_path: str, kv_cache_gib: float, threads, activations: str = "fp32") -> dict:
    """Load time (import included) and peak RSS of a fresh process that loads the model and decodes
    16 tokens, as `specserve generate` would."""
    r = subprocess.run([sys.executable, "-c", _LOAD_PROBE, model_path, str(kv_cache_gib), str(threads or 0), activations],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return {"error": (r.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def arithmetic_floor_ms(llm: LLM, rows: int = 16) -> float:
    """The block kernels' arithmetic per token: one rows-row pass over every layer's products and the
    head, per row (weights amortised over the rows, so this is the kernel's compute, not memory)."""
    model = llm.engine.model
    lins = [lin for layer in model.layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)] + [model.lm_head]
    xs = {lin: torch.randn(rows, (lin.block.shape if lin.block is not None else lin.dense.shape)[1]) for lin in lins}
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for lin in lins:
            lin(xs[lin])
        best = min(best, time.perf_counter() - t0)
    return best / rows * 1e3


def run_decode_bench(args) -> dict:
    torch.set_num_threads(args.threads or os.cpu_count())
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    wanted = set(args.peers.split(",")) if args.peers else set()
    prompts = humaneval_prompts(args.prompts)
    llm = LLM(**llm_kwargs(args))
    if not llm.engine.model_path.endswith(".gguf") and wanted & {"hf-fp32", "hf-bf16", "llama.cpp"}:
        print("peers load the same GGUF; with a non-GGUF model only the engine runs")
        wanted = set()
    ids = [llm.tokenizer.encode(p) for p in prompts]
    max_new = args.max_tokens

    systems = ["specserve"] + [p for p in ("hf-fp32", "hf-bf16", "llama.cpp") if p in wanted]
    if "llama.cpp" in systems and not peers.llama_cpp_available():
        print("llama.cpp: llama-cpp-python is not installed (make llamacpp); skipped")
        systems.remove("llama.cpp")
    peer_batches = {int(b) for b in args.peer_batch_sizes.split(",")}
    batches_of = {s: [b for b in batch_sizes if s == "specserve" or (b in peer_batches and (s != "llama.cpp" or b == 1))]
                  for s in systems}
    jobs = [(s, b) for s in systems for b in batches_of[s]]
    results: dict = {s: {} for s in systems}
    greedy_ids: dict = {}
    bar = tqdm(total=sum(len(ids) if b == 1 else 1 for _, b in jobs), desc="bench decode", unit="run")
    hf_fp32 = None
    llama_process: dict = {}
    for system in systems:
        if system == "specserve":
            llm.generate([ids[0]], SamplingParams(temperature=0, max_tokens=8))  # warm-up
            run = lambda i, b: _engine_run(llm, i, max_new, b)
        elif system.startswith("hf"):
            bar.set_postfix_str(f"loading {system}")
            dtype = torch.float32 if system == "hf-fp32" else torch.bfloat16
            model = peers.load_hf(llm.engine.model_path, dtype, args.device,
                                  base=hf_fp32 if dtype != torch.float32 else None)
            if dtype == torch.float32:
                hf_fp32 = model
            peers.hf_generate(model, ids[0], 4, 1, 0.0, SEED)  # warm-up
            run = lambda i, b, m=model: peers.hf_generate(m, i, max_new, b, 0.0 if b == 1 else TEMPERATURE, SEED)
        else:  # greedy batch 1 only, in a child process (see peers.llama_cpp_runs)
            bar.set_postfix_str("llama.cpp batch 1")
            runs = peers.llama_cpp_runs(llm.engine.model_path, args.threads, ids, max_new) if 1 in batch_sizes else None
            bar.update(len(ids) if 1 in batch_sizes else 0)
            if runs is None:  # failed (it said why) or not asked for: the other systems' results stand
                del results[system]
                continue
            greedy_ids[system] = [r["output_ids"] for r in runs]
            results[system][1] = _median_runs(runs)
            llama_process = {k: runs[0][k] for k in ("load_s", "peak_rss_mb") if k in runs[0]}
            continue
        for b in batches_of[system]:
            bar.set_postfix_str(f"{system} batch {b}")
            runs = []
            for prompt_ids in (ids if b == 1 else ids[:1]):
                runs.append(run(prompt_ids, b))
                bar.update(1)
            if b == 1:
                greedy_ids[system] = [r["output_ids"] for r in runs]
            results[system][b] = _median_runs(runs)
    bar.close()

    bw = peers.memory_bandwidth_gbs(device=args.device)
    arch = llm.engine.arch
    engine_bytes = llm.engine.model.weight_bytes
    fp32_bytes = arch.num_params * 4
    arithmetic = arithmetic_floor_ms(llm) if args.device == "cpu" else None
    probe = load_probe(llm.engine.model_path, args.kv_cache_gib, args.threads, args.activations) \
        if args.device == "cpu" else {}
    floor = {"bandwidth_gbs": bw, "specserve_arithmetic_ms": arithmetic, "activations": args.activations,
             "specserve_weight_bytes": engine_bytes, "specserve_floor_ms": engine_bytes / bw / 1e6,
             "fp32_weight_bytes": fp32_bytes, "fp32_floor_ms": fp32_bytes / bw / 1e6,
             "gguf_file_bytes": os.path.getsize(llm.engine.model_path) if os.path.isfile(llm.engine.model_path) else None}
    identical = {s: all(_same_until_eos(a, b, llm.tokenizer.eos_token_ids) for a, b in zip(greedy_ids["specserve"], ids_s))
                 for s, ids_s in greedy_ids.items() if s != "specserve"}
    report = {
        "benchmark": "decode", "time": time.strftime("%Y-%m-%d %H:%M:%S"), "model": llm.engine.model_path,
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                    "torch": torch.__version__, "device": args.device,
                    "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None},
        "settings": {"prompts": len(prompts), "max_new_tokens": max_new, "batch_sizes": batch_sizes,
                     "batch1": "greedy, median over prompts", "batchN": f"n seeded samples of prompt 0, T={TEMPERATURE}",
                     "engine_dtype": llm.config.model.resolved_dtype(), "activations": args.activations,
                     "engine_block_kernels": llm.engine.model.layers[0].qkv.block is not None},
        "results": {s: {str(b): v for b, v in r.items()} for s, r in results.items()},
        "greedy_identical_to_engine": identical,
        "hardware_floor": floor,
        "specserve_process": probe,
        "llama_cpp_process": llama_process,
        "cpu_flags": peers.cpu_flags(),
    }
    md = to_markdown(report)
    os.makedirs(args.out, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for name in (f"decode-{stamp}", "decode-latest"):
        json.dump(report, open(os.path.join(args.out, name + ".json"), "w"), indent=2)
        open(os.path.join(args.out, name + ".md"), "w").write(md)
    print(md)
    print(f"written to {args.out}/decode-{stamp}.{{json,md}}")
    return report


def to_markdown(r: dict) -> str:
    res = r["results"]
    eng = res["specserve"]
    lines = [f"# Decode benchmark ({r['time']})", "",
             f"Model `{os.path.basename(r['model'])}`, {r['settings']['prompts']} HumanEval prompts, "
             f"{r['settings']['max_new_tokens']} new tokens, device {r['machine'].get('gpu') or r['machine']['device']}, "
             f"{r['machine']['threads']} CPU threads, torch {r['machine']['torch']}, engine dtype {r['settings']['engine_dtype']}, "
             f"{r['settings'].get('activations', 'fp32')} activations. "
             f"Batch 1: greedy (median over prompts); batch N: {r['settings']['batchN']}.", "",
             "| system | batch | decode ms/step | TTFT ms | tokens/s | specserve speed-up (ms/step) | specserve throughput ratio |",
             "|---|---|---|---|---|---|---|"]
    for system, rows in res.items():
        for b, v in rows.items():
            e = eng.get(b)
            sp = f"{v['decode_ms_per_step'] / e['decode_ms_per_step']:.2f}x" if e and system != "specserve" else "-"
            tp = f"{e['tokens_per_s'] / v['tokens_per_s']:.2f}x" if e and system != "specserve" else "-"
            lines.append(f"| {system} | {b} | {v['decode_ms_per_step']:.1f} | {v['ttft_s'] * 1e3:.0f} | "
                         f"{v['tokens_per_s']:.1f} | {sp} | {tp} |")
    f = r["hardware_floor"]
    lines += ["", f"Hardware floor at batch 1 (weight bytes per token / measured read bandwidth {f['bandwidth_gbs']:.1f} GB/s): "
              f"specserve's blocked weights {f['specserve_weight_bytes'] / 1e6:.0f} MB -> {f['specserve_floor_ms']:.1f} ms/token; "
              f"dense fp32 {f['fp32_weight_bytes'] / 1e6:.0f} MB -> {f['fp32_floor_ms']:.1f} ms/token."]
    if f.get("specserve_arithmetic_ms"):
        lines += ["", f"Arithmetic floor of specserve's kernels ({f.get('activations', 'fp32')} activations): "
                  f"{f['specserve_arithmetic_ms']:.1f} ms "
                  "per token (a 16-row pass over every product, per row: the weights' reads amortised away)."]
    pr = r.get("specserve_process") or {}
    if "load_s" in pr:
        lines += ["", f"A fresh specserve process (load, then 16 tokens): loaded in {pr['load_s']:.2f} s (imports "
                  f"included), peak RSS {pr['peak_rss_mb']:.0f} MB."]
    lp = r.get("llama_cpp_process") or {}
    if "load_s" in lp:
        lines += ["", f"llama.cpp (its child process, n_ctx 2048): loaded in {lp['load_s']:.2f} s (imports excluded), "
                  f"peak RSS {lp['peak_rss_mb']:.0f} MB."]
    if r.get("cpu_flags"):
        lines += ["", f"CPU: {r['cpu_flags']}"]
    if r["greedy_identical_to_engine"]:
        lines += ["", "Greedy batch-1 tokens identical to specserve (up to the first EOS): " +
                  ", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in r["greedy_identical_to_engine"].items())]
    return "\n".join(lines) + "\n"
