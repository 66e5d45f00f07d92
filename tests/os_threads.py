"""Helpers for tests of OS threads (Linux): a thread's name, the threads with a name, a function run
on a thread of its own. Linux gives a new thread the name of the thread that created it, so a thread
named here finds the OpenMP workers it starts under its name (after torch.set_num_threads, which starts
the workers of torch's other pool, pthreadpool's, and after a first generate, which starts the
tokenizer's)."""
import ctypes
import os
import threading
import time

PR_SET_NAME = 15


def name_this_thread(name: str) -> None:
    assert ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, name.encode(), 0, 0, 0) == 0


def threads_named(name: str, settle_to: int = 0, timeout: float = 2.0) -> int:
    """This process's threads called `name`. With settle_to, read again for up to `timeout` seconds
    until the count is that: a joined thread leaves /proc a moment after pthread_join returns."""
    deadline = time.monotonic() + timeout
    while True:
        n = 0
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    n += f.read().strip() == name
            except OSError:  # a thread that ended meanwhile
                pass
        if not settle_to or n == settle_to or time.monotonic() > deadline:
            return n
        time.sleep(0.01)


def on_a_thread(fn, timeout: float = 300.0):
    """fn() on a new thread; its exception raised again here, not lost with the thread."""
    box, errors = [], []

    def run():
        try:
            box.append(fn())
        except BaseException as e:
            errors.append(e)

    th = threading.Thread(target=run)
    th.start()
    th.join(timeout)
    if th.is_alive():
        raise TimeoutError(f"{fn} still running after {timeout} s")
    if errors:
        raise errors[0]
    return box[0]
