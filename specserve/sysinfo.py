"""What this machine gives specserve, for bug reports and benchmark records: the CPU and the instruction
sets the kernels dispatch on, the kernel build each product runs, torch and its device, the optional
packages, the environment switches, and the pulled models (`specserve env`; llama.cpp prints the like as
its system_info line, vLLM as collect-env)."""
from __future__ import annotations

import importlib.metadata
import os
import platform
import sys

# The instruction sets the kernels choose between, in /proc/cpuinfo's names.
FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni", "avx_vnni", "avx512_bf16",
         "amx_tile", "amx_int8", "amx_bf16")
PACKAGES = ("torch", "transformers", "gguf", "llguidance", "triton", "numpy", "fastapi", "ray")
SWITCHES = ("SPECSERVE_NO_KERNELS", "SPECSERVE_NO_AVX512", "SPECSERVE_NO_AMX", "SPECSERVE_NO_MALLOPT",
            "SPECSERVE_KERNEL_CACHE", "SPECSERVE_MODELS", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")


def _cpu() -> dict:
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    return {"model": model, "cores": os.cpu_count(), "flags": [f for f in FLAGS if f in flags]}


def _kernels() -> dict:
    """Which build each kernel runs here (the CPU's own choice), or why there are none."""
    from . import kernels
    if not kernels.available():
        why = "SPECSERVE_NO_KERNELS is set" if os.environ.get("SPECSERVE_NO_KERNELS") else "no AVX2, or no compiler"
        return {"available": False, "why": f"{why}: dense fp32 weights (same results, slower)"}
    ext = kernels.ext()
    return {"available": True, "directory": kernels.build_directory(),
            "fp32 activations": "avx512" if ext.block_kernel_avx512() else "avx2",
            "fp32 activations, Q4_0/Q4_1/Q8_0 past 8 rows": "amx (bf16 tiles)" if kernels.amx_available() else "as above",
            "int8 activations (--activations int8)": ext.q8_kernel_build()}


def _device() -> dict:
    import torch
    out = {"threads": torch.get_num_threads(), "cuda": torch.cuda.is_available()}
    if out["cuda"]:
        p = torch.cuda.get_device_properties(0)
        out.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2 ** 30, 1), gpus=torch.cuda.device_count())
    return out


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def system_info() -> dict:
    """The machine as specserve sees it (plain data: print it, or dump it as JSON)."""
    from . import __version__
    from .loading.pull import list_models
    return {"specserve": __version__, "python": sys.version.split()[0], "platform": platform.platform(),
            "cpu": _cpu(), "torch": _device(), "kernels": _kernels(),
            "packages": {p: _version(p) for p in PACKAGES},
            "switches": {k: os.environ[k] for k in SWITCHES if k in os.environ},
            "models": {m["name"]: m["path"] for m in list_models()}}


def summary_line(info: dict) -> str:
    """One line of it, for a server's start-up log: the CPU, its kernel-relevant flags, the builds, the device."""
    cpu, dev, k = info["cpu"], info["torch"], info["kernels"]
    kern = (f"fp32 {k['fp32 activations']}, int8 {k['int8 activations (--activations int8)']}" if k["available"]
            else "none (dense fp32)")
    gpu = f"{dev['gpus']} x {dev['gpu']}" if dev["cuda"] else "none"
    flags = [f for f in cpu["flags"] if f in ("avx2", "avx512f", "avx512_vnni", "amx_int8", "amx_bf16")]
    return f"{cpu['model']} ({' '.join(flags)}), {dev['threads']} threads; kernels: {kern}; CUDA: {gpu}"


def speed_hint(info: dict, device: str, weight_kernel: str) -> str | None:
    """A start-up line where a switch would make decoding much faster on this machine, else None. On a CPU
    without AVX-512 the fp32 mode decodes each GGUF weight to fp32 in ~20 instructions per 32, at half
    llama.cpp's speed on the 1.5B Q4_K_M (0.54x), where the int8 mode matched it (0.99x;
    docs/decisions.md#fp32-avx2-q4k, #q8-avx2)."""
    k = info["kernels"]
    if device.split(":")[0] != "cpu" or weight_kernel != "gguf" or not k["available"] or k["fp32 activations"] != "avx2":
        return None
    why = ("SPECSERVE_NO_AVX512 is set" if "SPECSERVE_NO_AVX512" in info.get("switches", {})
           else "this CPU lacks AVX-512 (F, BW, DQ and VL)")
    return (f"{why}: with fp32 activations (exact, the default) GGUF blocks decode slower than llama.cpp here "
            "(Qwen2.5-Coder-1.5B Q4_K_M: 0.54x); --activations int8 (8-bit, as llama.cpp) matched it (0.99x)")


def format_system_info(info: dict) -> str:
    """system_info() as aligned `key: value` lines, one section a block."""
    cpu, dev, k = info["cpu"], info["torch"], info["kernels"]
    lines = [f"specserve {info['specserve']}, Python {info['python']}, {info['platform']}",
             f"CPU: {cpu['model']}, {cpu['cores']} logical cores; {' '.join(cpu['flags']) or 'none of ' + ' '.join(FLAGS)}",
             f"torch: {info['packages']['torch']}, {dev['threads']} threads; CUDA: "
             + (f"{dev['gpus']} x {dev['gpu']} ({dev['gpu_memory_gib']} GiB)" if dev["cuda"] else "none"),
             "kernels:" + ("" if k["available"] else f" none ({k['why']})")]
    if k["available"]:
        lines += [f"  {key}: {value}" for key, value in k.items() if key != "available"]
    lines.append("packages: " + ", ".join(f"{p} {v or '-'}" for p, v in info["packages"].items()))
    lines.append("switches: " + (", ".join(f"{k}={v}" for k, v in info["switches"].items()) or "none set"))
    lines.append("models:")
    lines += [f"  {name}: {path or 'not pulled'}" for name, path in info["models"].items()]
    return "\n".join(lines)
