"""One OpenMP pool at a time: a thread that stops stepping an engine frees its pool (libgomp;
torch-free).

libgomp keeps a pool of worker threads for every thread that has run a parallel region, for as long
as that thread lives. Once the pools' workers outnumber the cores, a waiting worker spins ~100 times
instead of ~300,000 before it sleeps, so each of a step's hundreds of parallel regions pays a futex
wake-up. An LLM built on one thread and stepped on another (a web handler's) ran 1.7x slower on 2
cores: the Qwen2.5-Coder-1.5B in int8 at 102 against 61 ms a token, the thread governor (threads.py)
reading the sleeping workers as a competitor and falling back to one thread (docs/decisions.md#omp-pools).

OpenMP 5.0's omp_pause_resource_all(omp_pause_soft) frees the calling thread's pool (libgomp's
gomp_pause_host; it refuses inside a parallel region). The thread's next parallel region starts a new
pool, about 0.1 ms on this VM, and the thread keeps its own thread count (omp_set_num_threads). So the
LLM frees the pool of the thread that built it once it is built, and that of each thread that called
generate when the call returns: whichever thread steps next finds no other pool beside its own.

That a pause frees only the caller's pool is libgomp's reading of OpenMP 5.0 (the standard speaks of
the runtime's resources as a whole; LLVM's libomp stops every thread), hence libgomp only, by file
name. Not covered: a torch whose OpenMP runtime is Intel's or LLVM's (conda builds); there nothing of
torch's is freed, and a libgomp another library brought in can still answer True.
"""
from __future__ import annotations

import ctypes
import os
import threading
from typing import Callable, Optional

OMP_PAUSE_SOFT = 1

_pauses: Optional[list[Callable[[int], int]]] = None
_unsafe = False  # in a child forked while the forking thread's pool could not be freed


def libgomp_paths() -> list[str]:
    """The libgomp files mapped into this process (torch's own, and any other an extension loaded:
    each keeps its own pools); none where there is no /proc (not Linux)."""
    paths: list[str] = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(maxsplit=5)  # address perms offset dev inode [path]
                path = parts[5].strip() if len(parts) == 6 else ""
                if os.path.basename(path).startswith("libgomp") and path not in paths:
                    paths.append(path)
    except OSError:
        pass
    return paths


def _libgomp_pauses(refresh: bool) -> list[Callable[[int], int]]:
    """omp_pause_resource_all of every libgomp mapped, looked up again on `refresh` (after a model
    and its kernels are loaded: an extension may bring in a libgomp of its own)."""
    global _pauses
    if _pauses is None or refresh:
        found = []
        for path in libgomp_paths():
            try:
                fn = ctypes.CDLL(path).omp_pause_resource_all  # dlopen by path: the copy already mapped
            except (OSError, AttributeError):  # a libgomp older than OpenMP 5.0 (GCC 9)
                continue
            fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
            found.append(fn)
        _pauses = found  # assigned whole: a thread reading it meanwhile sees the old list or the new
    return _pauses


def can_free_pools() -> bool:
    """Whether this process has a libgomp whose pools free_thread_pool can free."""
    return not _unsafe and bool(_libgomp_pauses(False))


def free_thread_pool(refresh: bool = False) -> bool:
    """Free the calling thread's OpenMP pool; True where every libgomp did (it had one or not), False
    where there is no libgomp with omp_pause_resource_all, or the thread is inside a parallel region."""
    pauses = [] if _unsafe else _libgomp_pauses(refresh)
    return bool(pauses) and all([p(OMP_PAUSE_SOFT) == 0 for p in pauses])  # a list: each one is paused


# A forked child keeps the forking thread's pool, but not its workers: pausing it there would wait for
# them forever. So the pool is freed before the fork, in the forking thread (per thread: two threads may
# fork at once); where that fails the child never pauses. The child still inherits libgomp's count of
# managed threads, other threads' workers included, which it never lowers: its own pools spin briefly.
_fork = threading.local()


def _before_fork() -> None:
    pauses = _libgomp_pauses(False)
    _fork.safe = not pauses or free_thread_pool()  # without a pause function nothing is ever paused


def _after_fork_in_child() -> None:
    global _unsafe
    _unsafe = _unsafe or not getattr(_fork, "safe", True)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
