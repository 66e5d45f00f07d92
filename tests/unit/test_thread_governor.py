"""The thread governor (engine/threads.py) with fake clocks: idle steps keep every core, a competitor
taking a core drops the count, a probe returns to every core, and stays there once the competitor left."""
from specserve.engine.threads import ThreadGovernor


class FakeMachine:
    """Steps of 0.1 s wall; the process gets `share` cores of CPU time per second of wall."""

    def __init__(self):
        self.t = self.cpu = 0.0
        self.share = 2.0
        self.set_calls = []

    def run(self, gov: ThreadGovernor, steps: int):
        for _ in range(steps):
            gov.begin()
            self.t += 0.1
            self.cpu += 0.1 * min(self.share, gov.threads)
            gov.end()


def make(machine, n=2):
    return ThreadGovernor(n, machine.set_calls.append, window_s=0.25, probe_s=2.0,
                          clock=lambda: machine.t, cpu_clock=lambda: machine.cpu)


def test_an_idle_machine_keeps_every_thread():
    m = FakeMachine()
    m.share = 1.9  # spinning threads read a little under n even when idle
    gov = make(m)
    m.run(gov, 200)
    assert gov.threads == 2 and m.set_calls == []


def test_a_competitor_drops_a_thread_probes_return_and_stay_once_it_left():
    m = FakeMachine()
    gov = make(m)
    m.run(gov, 9)
    m.share = 1.3  # another busy process takes part of a core
    m.run(gov, 3)
    assert gov.threads == 1 and m.set_calls == [1]
    m.run(gov, 24)  # 2 s at one thread: a probe at 2, which still sees the competitor
    assert m.set_calls[:3] == [1, 2, 1] and gov.threads == 1
    m.share = 2.0  # the competitor left
    m.run(gov, 30)
    assert gov.threads == 2 and m.set_calls[-1] == 2
    calls = len(m.set_calls)
    m.run(gov, 100)
    assert len(m.set_calls) == calls  # no more probing at full count


def test_many_cores_lose_only_what_the_competitor_takes():
    m = FakeMachine()
    m.share = 14.6
    gov = make(m, n=16)
    m.run(gov, 3)
    assert gov.threads == 14 and gov.changes == [(14, gov.changes[0][1])]
