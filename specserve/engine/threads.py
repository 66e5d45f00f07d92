"""Fewer CPU threads while another process competes for the cores (torch-free; the engine passes
torch.set_num_threads in).

OpenMP threads spin at each of a step's many barriers. On an idle machine that is the fastest choice
(waking sleeping threads costs more), but when another busy process takes a core, every barrier waits
for whichever of our threads the OS has descheduled, and a step runs several times slower than with
one thread fewer (docs/decisions.md#threads).

The signal: spinning counts as CPU time, so over a window of steps an unhindered process gets CPU
time / wall time ~ its thread count n; beside a competitor it gets visibly less. Below n - MARGIN
the governor drops to the share it got; every `probe_s` it runs one window at n again to see whether
the competitor left. Outputs do not depend on the thread count (the block kernels give each output
column to one thread), so switching is safe.
"""
from __future__ import annotations

import time
from typing import Callable


class ThreadGovernor:
    MARGIN = 0.35  # cores: the idle share sits within ~0.1 of n, a competitor takes ~0.5 or more

    def __init__(self, max_threads: int, set_threads: Callable[[int], None], window_s: float = 0.3,
                 min_steps: int = 3, probe_s: float = 5.0, clock: Callable[[], float] = time.perf_counter,
                 cpu_clock: Callable[[], float] = time.process_time):
        self.max_threads = max_threads
        self.threads = max_threads
        self._set, self._clock, self._cpu = set_threads, clock, cpu_clock
        self.window_s, self.min_steps, self.probe_s = window_s, min_steps, probe_s
        self._wall = self._cpu_used = 0.0
        self._steps = 0
        self._reduced_for = 0.0  # step wall time spent below max_threads since the last probe
        self._t0 = self._c0 = 0.0
        self.changes: list[tuple[int, float]] = []  # (threads, share that decided it), for tests and logs

    def begin(self) -> None:
        self._t0, self._c0 = self._clock(), self._cpu()

    def end(self) -> None:
        wall = self._clock() - self._t0
        self._wall += wall
        self._cpu_used += self._cpu() - self._c0
        self._steps += 1
        if self.threads < self.max_threads:
            self._reduced_for += wall
            if self._reduced_for >= self.probe_s:  # has the competitor left? try every core for one window
                self._reduced_for = 0.0
                self._switch(self.max_threads, share=-1.0)
                return
        if self._wall < self.window_s or self._steps < self.min_steps:
            return
        share = self._cpu_used / self._wall
        self._wall = self._cpu_used = 0.0
        self._steps = 0
        if share < self.threads - self.MARGIN:  # (after a probe: the competitor is still there)
            self._switch(max(1, min(self.threads - 1, int(share + 0.25))), share)

    def _switch(self, n: int, share: float) -> None:
        if n != self.threads:
            self.threads = n
            self._set(n)
            self.changes.append((n, share))
            self._wall = self._cpu_used = 0.0
            self._steps = 0
