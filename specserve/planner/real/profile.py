"""`specserve profile`: time the model's units (embedding, each layer, head) on this machine.

Units are timed inside whole forward passes on one thread (a serving process gets one core here),
with an idle gap before each pass as between served requests: timing one unit over and over keeps
its weights in cache and reads ~20% fast against what a serving process sees. Median of `reps`.
The stage-boundary cost is a gloo ping-pong of one stage's activations
[T, hidden] between two processes (half the round trip). The result feeds MeasuredCostModel, which
turns it into stage latencies for any pipeline split.
"""
from __future__ import annotations

import os
import statistics
import time

import torch

from ..cost_model import LayerProfile
from .launch import free_port, join, spawn
from .stages import PipelineStage, load_model, num_units


def _unit_times(stages, ids, reps: int, gap_s: float) -> tuple[list[float], float]:
    """Median seconds per unit, timed in order within passes, and the median whole pass."""
    per_unit, passes = [[] for _ in stages], []
    for r in range(reps + 2):  # two warm-up passes
        time.sleep(gap_s)
        x, start = ids, time.perf_counter()
        for u, stage in enumerate(stages):
            t0 = time.perf_counter()
            x = stage.run(x)
            if r >= 2:
                per_unit[u].append(time.perf_counter() - t0)
        if r >= 2:
            passes.append(time.perf_counter() - start)
    return [statistics.median(v) for v in per_unit], statistics.median(passes)


def _pingpong(rank: int, port: int, shape, reps: int):
    import torch.distributed as dist
    join(rank, port, 2)
    buf = torch.zeros(shape)
    times = []
    for i in range(reps + 5):
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        else:
            dist.recv(buf, 0)
            dist.send(buf, 0)
        if i >= 5:
            times.append(time.perf_counter() - t0)
    dist.destroy_process_group()
    return statistics.median(times) / 2


def measure_boundary(shape, reps: int = 50) -> float:
    return spawn(_pingpong, 2, free_port(), shape, reps)[0]


def profile_model(model_path=None, tokens: int = 16, reps: int = 30, threads: int = 1,
                  gap_s: float = 0.05) -> LayerProfile:
    torch.set_num_threads(threads)
    model = load_model(model_path)
    n = num_units(model)
    ids = torch.randint(0, model.arch.vocab_size, (tokens,))
    unit_s, pass_s = _unit_times([PipelineStage(model, u, u + 1, tokens) for u in range(n)], ids, reps, gap_s)
    boundary = measure_boundary((tokens, model.arch.hidden_size))
    name = "embedded" if model_path is None else os.path.splitext(os.path.basename(model_path.rstrip("/")))[0].lower()
    return LayerProfile(model=name, layer_s=unit_s, layer_bytes=model.unit_bytes(), boundary_s=boundary,
                        tokens=tokens, device="cpu",
                        meta={"threads": threads, "reps": reps, "gap_s": gap_s, "whole_pass_s": pass_s,
                              "units": ["embedding"] + [f"layer {i}" for i in range(n - 2)] + ["norm+head"],
                              "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")})
