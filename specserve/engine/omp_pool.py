"""One OpenMP pool at a time: a thread that stops stepping an engine frees its pool (libgomp;
torch-free).

libgomp keeps a pool of worker threads for every thread that has run a parallel region, for as long
as that thread lives. Once the pools' workers outnumber the cores, a waiting worker spins ~100 times
instead of ~300,000 before it sleeps, so each of a step's hundreds of parallel regions pays a futex
wake-up. An LLM built on one thread and stepped on another (a web handler's thread) ran 1.7x slower
on 2 cores: the Qwen2.5-Coder-1.5B in int8 at 104.9 against 61.8 ms a token
(docs/decisions.md#engine-thread).

OpenMP 5.0's omp_pause_resource_all(omp_pause_soft) frees the calling thread's pool (libgomp's
gomp_pause_host; it refuses inside a parallel region). The thread's next parallel region starts a new
pool, about 0.1 ms on this VM, and the thread keeps its own thread count (omp_set_num_threads). So the
LLM frees the pool of the thread that built it once it is built, and that of each thread that called
generate when the call returns: whichever thread steps next finds no other pool beside its own.
"""
from __future__ import annotations

import ctypes
from typing import Callable, Optional

OMP_PAUSE_SOFT = 1

_pauses: Optional[list[Callable[[int], int]]] = None


def _libgomp_pauses() -> list[Callable[[int], int]]:
    """omp_pause_resource_all of every libgomp mapped into this process (torch's own, and any other
    an extension loaded: each keeps its own pools), found once, after torch is imported."""
    global _pauses
    if _pauses is None:
        paths: list[str] = []
        try:
            with open("/proc/self/maps") as f:
                for line in f:
                    parts = line.split(maxsplit=5)  # address perms offset dev inode [path]
                    path = parts[5].strip() if len(parts) == 6 else ""
                    if "/libgomp" in path and path not in paths:
                        paths.append(path)
        except OSError:  # not Linux: no libgomp to find this way (macOS builds use LLVM's libomp)
            pass
        _pauses = []
        for path in paths:
            try:
                fn = ctypes.CDLL(path).omp_pause_resource_all  # the already mapped copy: dlopen by its path
            except (OSError, AttributeError):  # a libgomp older than OpenMP 5.0 (GCC 9)
                continue
            fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
            _pauses.append(fn)
    return _pauses


def free_thread_pool() -> bool:
    """Free the calling thread's OpenMP pool; True where a libgomp did (it had one or not), False where
    there is no libgomp with omp_pause_resource_all, or the thread is inside a parallel region."""
    pauses = _libgomp_pauses()
    return bool(pauses) and all(p(OMP_PAUSE_SOFT) == 0 for p in pauses)
