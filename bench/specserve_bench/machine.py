"""What every bench result names: the CPU model and the instruction sets the kernels dispatch on."""
from __future__ import annotations

import platform
import subprocess


def cpu() -> dict:
    """{"cpu": lscpu's model name, "flags": those of avx2 / avx512f / VNNI / AMX it has}."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    model = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")),
                 platform.processor() or platform.machine())
    return {"cpu": model, "flags": [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_tile", "amx_int8") if f" {f}" in out]}
