"""The peers a benchmark runs beside the engine, on the same weights: HF transformers and llama.cpp."""
from __future__ import annotations

import concurrent.futures
import copy
import multiprocessing
import os
import platform
import sys
import time
from typing import Optional

import torch


def load_hf(gguf_path: str, dtype: torch.dtype, device: str = "cpu", base=None):
    """HF transformers' own GGUF loader (dequantises to dense), or a dtype copy of an already loaded one."""
    if base is not None:
        return copy.deepcopy(base).to(dtype)
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path),
                                                dtype=dtype).eval().to(device)


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


@torch.inference_mode()
def hf_generate(model, ids: list[int], max_new: int, batch: int, temperature: float, seed: int) -> dict:
    """Time HF generate(): TTFT from a 1-token run, decode ms/token from the full run."""
    x = torch.tensor([ids], device=model.device)
    kw = dict(do_sample=temperature > 0, pad_token_id=model.config.eos_token_id or 0)
    if temperature > 0:
        kw.update(temperature=temperature, top_k=0, top_p=1.0, num_return_sequences=batch)
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    model.generate(x, max_new_tokens=1, min_new_tokens=1, **kw)
    sync(model.device)
    ttft = time.perf_counter() - t0
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    out = model.generate(x, max_new_tokens=max_new, min_new_tokens=max_new, **kw)
    sync(model.device)
    wall = time.perf_counter() - t0
    n_new = out.shape[1] - len(ids)
    return {"ttft_s": ttft, "decode_ms_per_step": (wall - ttft) / max(1, n_new - 1) * 1e3,
            "tokens_per_s": out.shape[0] * n_new / wall, "wall_s": wall, "tokens": out.shape[0] * n_new,
            "output_ids": out[0, len(ids):].tolist()}


def llama_cpp_available() -> bool:
    try:
        import llama_cpp  # noqa: F401
        return True
    except Exception:
        return False


def llama_cpp_runs(gguf_path: str, threads: Optional[int], prompts: list[list[int]], max_new: int,
                   stop_ids: Optional[list[int]] = None) -> Optional[list[dict]]:
    """llama_cpp_generate over each prompt, in a child process (_in_child). None when it failed."""
    return _in_child(_llama_cpp_child, gguf_path, threads, prompts, max_new, stop_ids)


def llama_cpp_pass_curve(gguf_path: str, threads: Optional[int], rows: tuple[int, ...], context: int = 128,
                         repeats: int = 3) -> Optional[dict[int, float]]:
    """Seconds of llama.cpp's pass over n new rows after `context` tokens, logits at every row (a verify
    pass), for each n in rows: the fastest of `repeats` llama_decode calls, the rows' KV removed after
    each (what bench/row_cost.py puts beside the engine's calibrated passes). None when it failed."""
    return _in_child(_llama_cpp_passes_child, gguf_path, threads, rows, context, repeats)


def _in_child(fn, *args):
    """fn(*args, extra_bufts) in a child process: llama.cpp is native code that can crash the
    interpreter, and a peer must never take the benchmark's own results down with it. Its AMX path
    (weights repacked into "extra buffer types" where the CPU reports AMX) segfaults on VMs that do
    not grant the tile state; then it runs again without extra buffers (its AVX-512 path). None when
    it failed both ways (said why)."""
    ctx = multiprocessing.get_context("spawn")
    for extra_bufts in (True, False):
        try:
            with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
                return pool.submit(fn, *args, extra_bufts).result()
        except Exception as e:  # BrokenProcessPool on a crash, or llama.cpp's own errors
            print(f"llama.cpp: its run {'with' if extra_bufts else 'without'} extra buffer types failed "
                  f"({type(e).__name__}: {str(e)[:160]})", file=sys.stderr)
    return None


def llama_cpp_prefill(gguf_path: str, threads: Optional[int], ids: list[int], repeats: int = 3) -> Optional[float]:
    """Seconds of llama.cpp's prefill of ids (its own batching, n_batch 512, logits of the last row
    only): the fastest of `repeats`, the cache cleared before each. None when it failed."""
    return _in_child(_llama_cpp_prefill_child, gguf_path, threads, ids, repeats)


def _load_llama_cpp(gguf_path: str, threads: Optional[int], extra_bufts: bool, **kw):
    import llama_cpp
    from llama_cpp import Llama
    if not extra_bufts:  # the high-level API has no switch for it; set it on the default model params
        defaults = llama_cpp.llama_cpp.llama_model_default_params

        def no_extra_bufts():
            params = defaults()
            params.use_extra_bufts = False
            return params
        llama_cpp.llama_cpp.llama_model_default_params = no_extra_bufts
    return Llama(model_path=gguf_path, n_threads=threads or os.cpu_count(), verbose=False, **kw)


def _llama_cpp_child(gguf_path: str, threads: Optional[int], prompts: list[list[int]], max_new: int,
                     stop_ids: Optional[list[int]], extra_bufts: bool) -> list[dict]:
    import llama_cpp  # noqa: F401  (before the clock: its load time excludes the imports)
    t0 = time.perf_counter()
    llm = _load_llama_cpp(gguf_path, threads, extra_bufts, n_ctx=max(2048, max(map(len, prompts)) + max_new + 16))
    load_s = time.perf_counter() - t0
    llama_cpp_generate(llm, prompts[0], 4)  # warm-up: its first evaluation sets up buffers
    runs = [llama_cpp_generate(llm, ids, max_new, stop_ids) for ids in prompts]
    for r in runs:  # this child process is llama.cpp alone: its load time (imports excluded) and peak RSS
        r.update(load_s=load_s, peak_rss_mb=peak_rss_mb())
    return runs


def _llama_cpp_prefill_child(gguf_path: str, threads: Optional[int], ids: list[int], repeats: int,
                             extra_bufts: bool) -> float:
    llm = _load_llama_cpp(gguf_path, threads, extra_bufts, n_ctx=len(ids) + 16, n_batch=512)
    llm.eval(ids[:32])  # warm-up: its first evaluation sets up buffers
    best = float("inf")
    for _ in range(repeats):
        llm.reset()
        llm._ctx.kv_cache_seq_rm(-1, 0, -1)
        t0 = time.perf_counter()
        llm.eval(ids)
        best = min(best, time.perf_counter() - t0)
    return best


def _llama_cpp_passes_child(gguf_path: str, threads: Optional[int], rows: tuple[int, ...], context: int,
                            repeats: int, extra_bufts: bool) -> dict[int, float]:
    top = max(rows)
    llm = _load_llama_cpp(gguf_path, threads, extra_bufts, n_ctx=context + top + 16, n_batch=max(512, top),
                          logits_all=True)
    ids = [(1000 + 37 * i) % llm.n_vocab() for i in range(context + top)]  # any tokens: the time is the same
    llm.eval(ids[:context])
    out: dict[int, float] = {}
    for n in [rows[0]] + list(rows):  # the first pass warms up
        best = float("inf")
        for _ in range(repeats):
            llm._ctx.kv_cache_seq_rm(-1, context, -1)
            llm._batch.set_batch(batch=ids[context:context + n], n_past=context, logits_all=True)
            t0 = time.perf_counter()
            llm._ctx.decode(llm._batch)
            best = min(best, time.perf_counter() - t0)
        out[n] = best
    return out


def llama_cpp_generate(llm, ids: list[int], max_new: int, stop_ids: Optional[list[int]] = None) -> dict:
    """Greedy batch-1 decode through llama.cpp's own sampling loop (its only batch mode here): TTFT
    and the decode rate from one run, timed at each token; it ends after a token of stop_ids (kept, as
    the engine keeps its EOS) or max_new tokens."""
    llm.reset()
    toks, stamps = [], []
    t0 = time.perf_counter()
    for tok in llm.generate(ids, temp=0.0, top_k=1, reset=True):
        toks.append(tok)
        stamps.append(time.perf_counter())
        if len(toks) >= max_new or (stop_ids and tok in stop_ids):
            break
    wall, ttft = stamps[-1] - t0, stamps[0] - t0
    return {"ttft_s": ttft, "decode_ms_per_step": (wall - ttft) / max(1, len(toks) - 1) * 1e3,
            "tokens_per_s": len(toks) / wall, "wall_s": wall, "tokens": len(toks), "output_ids": toks}


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM: unlike getrusage's maxrss, not inherited across fork
    and exec from a large parent)."""
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:")) / 1024


def cpu_flags() -> str:
    """The CPU's model name and the vector flags the kernels dispatch on (from /proc/cpuinfo)."""
    try:
        info = open("/proc/cpuinfo").read()
    except OSError:
        return platform.processor() or platform.machine()
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "?")
    flags = set(next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), []))
    wanted = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_int8")
    return f"{name}; " + " ".join(f for f in wanted if f in flags)


def memory_bandwidth_gbs(gib: float = 1.0, repeats: int = 5, device: str = "cpu") -> float:
    """Read bandwidth as torch sees it: the best of a few full sums over a buffer far larger than any cache."""
    x = torch.ones(int(gib * 2**30) // 4, dtype=torch.float32, device=device)
    x.sum()
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        x.sum()
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 4 / best / 1e9
