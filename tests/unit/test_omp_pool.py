"""engine/omp_pool.py: a thread's OpenMP pool is freed, and comes back at its next parallel region
with the thread's own thread count. A pool's workers are counted by name: Linux gives a new thread
the name of the thread that created it, so a thread named here finds its workers under its name
(after torch.set_num_threads, which starts the workers of torch's other pool, pthreadpool's)."""
import ctypes
import os
import sys
import threading

import pytest
import torch

from specserve.engine.omp_pool import free_thread_pool

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names from /proc (Linux)")

PR_SET_NAME = 15


def name_this_thread(name: str) -> None:
    assert ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, name.encode(), 0, 0, 0) == 0


def threads_named(name: str) -> int:
    """This process's threads called `name` (a thread and the pool workers it started)."""
    n = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                n += f.read().strip() == name
        except OSError:  # a thread that ended meanwhile
            pass
    return n


def on_a_thread(fn):
    box, errors = [], []

    def run():
        try:
            box.append(fn())
        except BaseException as e:  # raised again here, not lost with the thread
            errors.append(e)

    th = threading.Thread(target=run)
    th.start()
    th.join(60)
    if errors:
        raise errors[0]
    return box[0]


def libgomp_mapped() -> bool:
    with open("/proc/self/maps") as f:
        return any("/libgomp" in line for line in f)


@pytest.mark.skipif(not libgomp_mapped(), reason="torch here does not use libgomp")
def test_a_threads_pool_is_freed_and_comes_back_with_its_thread_count():
    def run():
        before = torch.get_num_threads()
        try:
            torch.set_num_threads(3)  # before the name: pthreadpool's workers keep the old one
            name_this_thread("spc-omp-test")
            torch.randn(1 << 20).exp_()  # a parallel region: this thread's pool, two workers
            with_pool = threads_named("spc-omp-test")
            freed = free_thread_pool()
            after_free = threads_named("spc-omp-test")
            kept = torch.get_num_threads()
            torch.randn(1 << 20).exp_()
            return with_pool, freed, after_free, kept, threads_named("spc-omp-test")
        finally:
            torch.set_num_threads(before)

    with_pool, freed, after_free, kept, again = on_a_thread(run)
    assert with_pool == 3  # the thread and its two workers
    assert freed is True
    assert after_free == 1  # the workers are gone
    assert kept == 3  # the thread's count stays
    assert again == 3  # and a new pool has it


@pytest.mark.skipif(not libgomp_mapped(), reason="torch here does not use libgomp")
def test_freeing_a_thread_without_a_pool_is_harmless():
    assert on_a_thread(free_thread_pool) is True
