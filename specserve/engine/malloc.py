"""Keep a step's freed memory for the next step (glibc malloc).

Each decode step allocates the logits [rows, vocab] and the sampler's copies of them afresh: with
Gemma 3's 262k vocabulary at batch 16, three tensors of 16 MB. glibc hands memory at the top of its
heap back to the OS once more than its trim threshold lies free there (by default twice the largest
mmap'd chunk freed so far, 32 MB here), so every step gave those ~50 MB back and page-faulted them in
again: ~4 ms a tensor, batch 16 at 32-34 ms a step instead of 20 (docs/decisions.md#malloc-trim).
vLLM's CPU backend recommends preloading TCMalloc for the same kind of churn; two mallopt calls do it
here without a preload, once the engine is loaded (what loading freed is given back first): chunks up
to 32 MB (glibc's ceiling for the setting) come from the heap, and up to 256 MB of freed heap stays
mapped. Peak RSS was unchanged in the same runs; SPECSERVE_NO_MALLOPT=1 leaves glibc's defaults.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
TRIM_THRESHOLD = 256 << 20  # a batch-32 step over a 262k vocabulary frees ~100 MB; 64 MB trimmed even 4 x 16 MB
MMAP_THRESHOLD = 32 << 20  # glibc refuses more (HEAP_MAX_SIZE / 2 on 64-bit)

_done = False


def keep_freed_memory() -> bool:
    """Set glibc's trim and mmap thresholds once per process; False where there is no glibc mallopt
    (musl, macOS) or SPECSERVE_NO_MALLOPT is set."""
    global _done
    if _done:
        return True
    if os.environ.get("SPECSERVE_NO_MALLOPT"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    libc.malloc_trim(0)  # what loading freed goes back first: only the steps' churn is kept
    _done = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    return _done
