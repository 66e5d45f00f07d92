"""engine/omp_pool.py: a thread's OpenMP pool is freed, and comes back at its next parallel region
with the thread's own thread count; a forked child of a thread whose pool is freed frees its own.
Workers are counted by name (tests/os_threads.py)."""
import os
import signal
import sys
import time

import pytest
import torch

from specserve.engine.omp_pool import can_free_pools, free_thread_pool
from tests.os_threads import name_this_thread, on_a_thread, threads_named

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names from /proc (Linux)"),
              pytest.mark.skipif(not can_free_pools(), reason="no libgomp with OpenMP 5.0's pause here")]


def test_a_threads_pool_is_freed_and_comes_back_with_its_thread_count():
    def run():
        before = torch.get_num_threads()
        try:
            torch.set_num_threads(3)  # before the name: pthreadpool's workers keep the old one
            name_this_thread("spc-omp-test")
            no_pool = free_thread_pool(), threads_named("spc-omp-test")
            torch.randn(1 << 20).exp_()  # a parallel region: this thread's pool, two workers
            with_pool = threads_named("spc-omp-test")
            freed = free_thread_pool()
            after_free = threads_named("spc-omp-test", settle_to=1)
            kept = torch.get_num_threads()
            torch.randn(1 << 20).exp_()
            return no_pool, with_pool, freed, after_free, kept, threads_named("spc-omp-test")
        finally:
            torch.set_num_threads(before)

    no_pool, with_pool, freed, after_free, kept, again = on_a_thread(run)
    assert no_pool == (True, 1)  # nothing to free: harmless
    assert with_pool == 3  # the thread and its two workers
    assert freed is True
    assert after_free == 1  # the workers are gone
    assert kept == 3  # the thread's count stays
    assert again == 3  # and a new pool has it


def test_a_child_forked_from_a_thread_with_a_pool_frees_its_own_and_runs():
    """The child keeps the forking thread's pool but not its workers; pausing that pool would wait for
    them forever. The pool is freed before the fork, so the child's freeing and parallel work run.
    Forked from a thread of its own with a pool of one worker (seen before the fork)."""
    def fork():
        before = torch.get_num_threads()
        try:
            torch.set_num_threads(2)  # before the name: pthreadpool's workers keep the old one
            name_this_thread("spc-omp-fork")
            torch.randn(1 << 20).exp_()  # this thread's pool
            assert threads_named("spc-omp-fork") == 2
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: report, and leave without running the parent's cleanups
                ok = free_thread_pool()
                torch.randn(1 << 20).exp_()
                os.write(w, b"ok" if ok and free_thread_pool() else b"no")
                os._exit(0)
            os.close(w)
            return pid, r
        finally:
            torch.set_num_threads(before)

    pid, r = on_a_thread(fork)
    try:
        deadline = time.monotonic() + 60
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        if done[0] == 0:  # the bug: the child waits for workers it does not have
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung freeing its pool")
        assert os.waitstatus_to_exitcode(done[1]) == 0 and os.read(r, 2) == b"ok"
    finally:
        os.close(r)
