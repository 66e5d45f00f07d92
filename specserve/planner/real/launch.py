"""Starting local process groups: torch.multiprocessing processes that join one torch.distributed
group over TCP on localhost (torchrun does the same across machines)."""
from __future__ import annotations

import socket

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(fn, world_size: int, port: int, *args) -> list:
    """Run fn(rank, port, *args, queue) in world_size processes; returns what they put on the queue.
    A process that fails makes this raise with its error."""
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    procs = [ctx.Process(target=fn, args=(rank, port, *args, queue), daemon=True) for rank in range(world_size)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    bad = [(i, p.exitcode) for i, p in enumerate(procs) if p.exitcode != 0]
    if bad:
        raise RuntimeError(f"process {bad[0][0]} of {world_size} exited with code {bad[0][1]}")
    out = []
    while not queue.empty():
        out.append(queue.get())
    return out
