"""Long prompts: time to first token and the decode step after a prompt of N tokens, side by side in
one run on the same GGUF and the same ids (real text: the Python standard library's inspect.py):
specserve (its automatic prefill chunk, prefix caching off) and llama.cpp (its own batching, in a child
process, without extra buffer types where those crash). Attention's share of a step grows with the
context, so this is where the paged attention kernel shows (docs/decisions.md#grouped-attention).

    python bench/long_context.py [--model qwen2.5-coder-0.5b] [--activations int8] [--contexts 256,2048,6144]
                                 [--decode 32] [--kv-cache-gib 2] [--kv-cache-dtypes auto,float16]

--kv-cache-dtypes runs specserve once per cache type (auto: f32 on CPU, exact; float16: llama.cpp's
default cache type, which its runs here use).

Writes bench/results/long-context-<time>.md / .json / .png.
"""
import argparse
import inspect
import sys
from pathlib import Path

import torch

from specserve import LLM, SamplingParams
from specserve.loading import resolve_model_path

sys.path.insert(0, str(Path(__file__).parent))
from specserve_bench import peers  # noqa: E402
from specserve_bench.machine import cpu  # noqa: E402
from specserve_bench.output import write_results  # noqa: E402


def markdown(r: dict) -> str:
    c = r["cpu"]
    chunks = ", ".join(f"{v} ({r['kv_names'][d]} KV)" for d, v in r["prefill_chunk"].items())
    peer = "; llama.cpp's KV cache f16" if "llama.cpp" in r else ""
    lines = [f"# Long prompts: {Path(r['model']).name}, {r['activations']} activations", "",
             f"CPU: {c['cpu']} ({', '.join(c['flags'])}), {r['threads']} threads; greedy, {r['decode']} tokens "
             f"decoded after each prompt; specserve's prefill chunk {chunks}{peer}.", "",
             "| prompt tokens | specserve KV cache | KV MiB | specserve TTFT s | llama.cpp TTFT s | TTFT speed vs llama.cpp "
             "| specserve decode ms/token | llama.cpp decode ms/token | decode speed vs llama.cpp |",
             "|---|---|---|---|---|---|---|---|---|"]
    for n in r["contexts"]:
        lc = r.get("llama.cpp", {}).get(str(n)) or r.get("llama.cpp", {}).get(n)
        for dtype, runs in r["specserve"].items():
            s = runs.get(str(n)) or runs.get(n)
            if lc:
                peer = (f"{lc['ttft_s']:.2f} | {lc['ttft_s'] / s['ttft_s']:.2f}x", f"{lc['decode_ms']:.1f} | "
                        f"{lc['decode_ms'] / s['decode_ms']:.2f}x")
            else:
                peer = ("- | -", "- | -")
            kv_mib = n * r["kv_bytes_per_token"][dtype] / 2**20
            lines.append(f"| {n} | {r['kv_names'][dtype]} | {kv_mib:.0f} | {s['ttft_s']:.2f} | {peer[0]} "
                         f"| {s['decode_ms']:.1f} | {peer[1]} |")
    return "\n".join(lines) + "\n"


def plot(r: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    series = {f"specserve, {r['kv_names'][d]} KV": runs for d, runs in r["specserve"].items()}
    if "llama.cpp" in r:
        series["llama.cpp, f16 KV"] = r["llama.cpp"]
    for name, runs in series.items():
        ns = [int(n) for n in runs]
        axes[0].plot(ns, [v["ttft_s"] for v in runs.values()], marker="o", label=name)
        axes[1].plot(ns, [v["decode_ms"] for v in runs.values()], marker="o", label=name)
    for ax, title in zip(axes, ("time to first token (s)", "decode step after the prompt (ms)")):
        ax.set_xlabel("prompt tokens")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"{Path(r['model']).name}, {r['activations']} activations, {r['cpu']['cpu']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--activations", default="int8", choices=("fp32", "int8"))
    ap.add_argument("--contexts", default="256,2048,6144")
    ap.add_argument("--decode", type=int, default=32, help="tokens decoded after each prompt")
    ap.add_argument("--kv-cache-gib", type=float, default=2.0)
    ap.add_argument("--kv-cache-dtypes", default="auto", help="comma-separated: auto (f32 on CPU), float16")
    args = ap.parse_args()
    path = resolve_model_path(args.model)
    contexts = [int(n) for n in args.contexts.split(",")]
    threads = torch.get_num_threads()
    result = {"model": path, "activations": args.activations, "threads": threads, "cpu": cpu(), "decode": args.decode,
              "contexts": contexts, "specserve": {}, "kv_bytes_per_token": {}, "kv_names": {}, "prefill_chunk": {}}
    sp = SamplingParams(temperature=0, max_tokens=args.decode + 1, ignore_eos=True)
    ids = None  # the prompt's ids: one tokenizer whatever the cache
    for dtype in args.kv_cache_dtypes.split(","):
        llm = LLM(path, activations=args.activations, enable_prefix_caching=False, kv_cache_gib=args.kv_cache_gib,
                  kv_cache_dtype=dtype)
        kv = llm.engine.kv
        result["kv_bytes_per_token"][dtype] = 2 * kv.k.element_size() * kv.k.shape[0] * kv.k.shape[2] * kv.k.shape[3]
        result["kv_names"][dtype] = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}[kv.k.dtype]
        if ids is None:
            text = Path(inspect.__file__).read_text()
            ids = llm.tokenizer.encode(text * (1 + 4 * max(contexts) // len(text)), add_special_tokens=False)
            assert len(ids) >= max(contexts), "the text is shorter than the longest context"
        llm.generate([ids[:64]], sp)  # warm-up
        result["prefill_chunk"][dtype] = llm.engine.prefill_chunk
        runs = result["specserve"][dtype] = {}
        for n in contexts:
            m = llm.generate([ids[:n]], sp)[0].metrics
            runs[n] = {"ttft_s": m["time_to_first_token"], "decode_ms": m["per_token_latency"] * 1e3}
            print(f"specserve {result['kv_names'][dtype]} KV {n}: {runs[n]}", flush=True)
        del llm, kv
    if peers.llama_cpp_available():
        runs = peers.llama_cpp_runs(path, threads, [ids[:n] for n in contexts], args.decode + 1)
        if runs is not None:
            result["llama.cpp"] = {n: {"ttft_s": v["ttft_s"], "decode_ms": v["decode_ms_per_step"]}
                                   for n, v in zip(contexts, runs)}
    write_results(result, str(Path(__file__).parent / "results"), "long-context", markdown, plot)


if __name__ == "__main__":  # llama.cpp runs in a spawned child, which imports this file
    main()
