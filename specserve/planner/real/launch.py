"""Joining a torch.distributed group: local processes started with torch.multiprocessing (TCP on
localhost), or processes started by torchrun (here or across machines; it sets RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT)."""
from __future__ import annotations

import os
import socket
import time
from typing import Optional

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def join(rank: int, port: Optional[int], world: int) -> None:
    """gloo: every message here is a small CPU tensor (nccl would need a GPU in every process)."""
    init = "env://" if port is None else f"tcp://127.0.0.1:{port}"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    torch.set_num_threads(1)  # one core per process


def torchrun_rank() -> Optional[tuple[int, int]]:
    """(rank, world size) when started by torchrun, else None."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(fn, rank, port, args, queue):
    queue.put((rank, fn(rank, port, *args)))


def spawn(fn, world_size: int, port: int, *args) -> list:
    """Run fn(rank, port, *args) in world_size processes; returns their return values by rank.
    Results are read while the processes run (a big one would fill the pipe and block its sender).
    A process that fails makes this raise."""
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    procs = [ctx.Process(target=_run, args=(fn, rank, port, args, queue), daemon=True) for rank in range(world_size)]
    for p in procs:
        p.start()
    out = {}
    try:
        while len(out) < world_size:
            if not queue.empty():
                rank, value = queue.get()
                out[rank] = value
                continue
            dead = [(i, p.exitcode) for i, p in enumerate(procs) if p.exitcode not in (None, 0) and i not in out]
            if dead:
                raise RuntimeError(f"process {dead[0][0]} of {world_size} exited with code {dead[0][1]}")
            time.sleep(0.02)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return [out[rank] for rank in range(world_size)]
