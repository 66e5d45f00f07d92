"""Serve a placement on real processes and replay a workload against it.

Rank 0 is the controller; device d is rank d + 1. Every group is a pipeline of pp = len(devices)
processes (intra-op sharding is not run for real); each process holds its stage of every model
of its group. The controller releases requests at their arrival times, sends each to the first
stage of the group serving its model with the fewest outstanding requests, and drops a request
when the measured cost model predicts it would miss its deadline (AlpaServe's controller does the
same). Stages pass the residual stream on with torch.distributed send/recv; the last stage sends
(request id, next token) back to the controller, whose receiving thread stamps the finish time.

All models of a placement are the profiled model (the embedded one), so a stage process builds the
model once and runs the same weights for each of its models: on this CPU a "model" is a name with
its own traffic, which is what placement decides about.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist

from ..cost_model import LayerProfile, MeasuredCostModel
from ..model_table import ModelSpec
from ..placement import GroupPlan
from ..simulator import Trace
from .launch import free_port, join, spawn, torchrun_rank
from .stages import PipelineStage, load_model

STOP = -1


@dataclass
class RealResult:
    finish: np.ndarray  # [N] seconds from the start of the replay; NaN: dropped by the controller
    arrival: np.ndarray  # [N]
    slo: np.ndarray  # [N] seconds
    tokens: np.ndarray  # [N] the next token each served request produced (-1: dropped)
    stage_s: dict  # device -> [requests] measured compute seconds of its stage
    sent: np.ndarray  # [N] when the controller sent each request on (NaN: dropped)

    @property
    def latencies(self) -> np.ndarray:
        ok = ~np.isnan(self.finish)
        return self.finish[ok] - self.arrival[ok]

    @property
    def slo_attainment(self) -> float:
        lat = self.finish - self.arrival
        return float(np.mean(np.nan_to_num(lat, nan=np.inf) <= self.slo)) if len(lat) else 1.0


def _worker(rank, port, world, groups, profile, model_path):
    join(rank, port, world)
    device = rank - 1
    gi = next(i for i, g in enumerate(groups) if device in g.devices)
    g = groups[gi]
    s = g.devices.index(device)
    first, last = s == 0, s == len(g.devices) - 1
    prev = 0 if first else g.devices[s - 1] + 1
    nxt = 0 if last else g.devices[s + 1] + 1
    stage = PipelineStage(load_model(model_path), *profile.split(len(g.devices))[s], profile.tokens)
    payload = torch.zeros(stage.input_shape, dtype=stage.input_dtype)
    for _ in range(3):  # warm-up before the clock starts
        stage.run(payload)
    dist.barrier()
    header = torch.zeros(2, dtype=torch.long)  # (request id, model index)
    compute = []  # seconds per request in this stage
    in_flight = ([], ())  # async sends to the next stage, and their buffers (alive until they complete)
    while True:
        dist.recv(header, prev)
        if header[0] == STOP:
            for w in in_flight[0]:
                w.wait()
            dist.send(torch.tensor([STOP, gi]) if last else header, nxt)
            break
        dist.recv(payload, prev)
        t0 = time.perf_counter()
        out = stage.run(payload)
        compute.append(time.perf_counter() - t0)
        if last:
            dist.send(torch.tensor([int(header[0]), int(out[0])]), 0)
        else:
            for w in in_flight[0]:
                w.wait()
            h = header.clone()
            in_flight = ([dist.isend(h, nxt), dist.isend(out, nxt)], (h, out))
    dist.barrier()
    dist.destroy_process_group()
    return compute


def _controller(rank, port, world, groups, profile, trace, slo, prompt):
    join(rank, port, world)
    costs = MeasuredCostModel(profile)
    spec = profile.spec()
    stage_lat = [costs.costs(spec, len(g.devices), 1).stage_latency_s for g in groups]
    serving = {m: [gi for gi, g in enumerate(groups) if name in g.models] for m, name in enumerate(trace.models)}
    n = len(trace)
    finish = np.full(n, np.nan)
    tokens = np.full(n, -1, dtype=np.int64)
    group_of = np.full(n, -1, dtype=np.int64)
    sent = np.full(n, np.nan)
    outstanding = [0] * len(groups)
    lock = threading.Lock()
    dist.barrier()  # every stage has loaded and warmed up
    t0 = time.perf_counter()

    def receive():
        buf = torch.zeros(2, dtype=torch.long)
        stops = 0
        while stops < len(groups):
            dist.recv(buf)  # from any last stage
            i, token = int(buf[0]), int(buf[1])
            if i == STOP:
                stops += 1
                continue
            finish[i] = time.perf_counter() - t0
            tokens[i] = token
            with lock:
                outstanding[group_of[i]] -= 1

    receiver = threading.Thread(target=receive, daemon=True)
    receiver.start()
    predicted_free = [[0.0] * len(g.devices) for g in groups]
    sends = []  # (work, buffer) of sends still in flight
    for i in range(n):
        wait = t0 + trace.arrival[i] - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        m = int(trace.model[i])
        cands = serving.get(m, [])
        if not cands:
            continue
        with lock:
            gi = min(cands, key=lambda c: (outstanding[c], c))
        # the same deadline check as the simulator, on the controller's own prediction of the stages
        t = max(time.perf_counter() - t0, trace.arrival[i])
        starts = []
        for s, dur in enumerate(stage_lat[gi]):
            t = max(t, predicted_free[gi][s])
            starts.append(t)
            t += dur
        if t - trace.arrival[i] > slo[m]:
            continue
        for s, dur in enumerate(stage_lat[gi]):
            predicted_free[gi][s] = starts[s] + dur
        with lock:
            outstanding[gi] += 1
        group_of[i] = gi
        sent[i] = time.perf_counter() - t0
        # async: a first stage still busy with an earlier request must not hold up other groups' requests
        first = groups[gi].devices[0] + 1
        h = torch.tensor([i, m])
        sends += [(dist.isend(h, first), h), (dist.isend(prompt, first), prompt)]
        sends = [(w, b) for w, b in sends if not w.is_completed()]
    for g in groups:
        h = torch.tensor([STOP, 0])
        sends.append((dist.isend(h, g.devices[0] + 1), h))
    for w, _ in sends:
        w.wait()
    receiver.join()
    dist.barrier()
    dist.destroy_process_group()
    return finish, tokens, sent


def _role(rank, port, world, groups, profile, model_path, trace, slo, prompt):
    if rank == 0:
        return _controller(rank, port, world, groups, profile, trace, slo, prompt)
    return _worker(rank, port, world, groups, profile, model_path)


def run_placement(groups: list[GroupPlan], trace: Trace, slo: dict[str, float], profile: LayerProfile,
                  model_path=None, seed: int = 0) -> Optional[RealResult]:
    """Serve `groups` (devices numbered from 0, op = 1) on len(devices) + 1 processes and replay `trace`.
    Started by torchrun (world size = devices + 1), this process plays its own rank and only rank 0
    gets the result; otherwise it starts the processes itself."""
    devices = sorted(d for g in groups for d in g.devices)
    if devices != list(range(len(devices))):
        raise ValueError(f"devices must be numbered 0..{len(devices) - 1} once each, got {devices}")
    bad = [g for g in groups if g.op != 1 or g.pp != len(g.devices)]
    if bad:
        raise ValueError(f"real execution runs pipelines only (op = 1, pp = devices): group {bad[0].devices} has "
                         f"pp={bad[0].pp}, op={bad[0].op}")
    world = len(devices) + 1
    slo_arr = np.asarray([slo[m] for m in trace.models])
    prompt = torch.randint(0, 1000, (profile.tokens,), generator=torch.Generator().manual_seed(seed))
    args = (world, groups, profile, model_path, trace, slo_arr, prompt)
    launched = torchrun_rank()
    if launched is not None:
        rank, size = launched
        if size != world:
            raise ValueError(f"this placement needs {world} processes (a controller + {len(devices)} devices), "
                             f"torchrun started {size}")
        out = _role(rank, None, *args)
        if rank != 0:
            return None
        stage_s = {}  # the controller does not see the stages' timings under torchrun
    else:
        outs = spawn(_role, world, free_port(), *args)
        out = outs[0]
        stage_s = {rank - 1: np.asarray(v) for rank, v in enumerate(outs) if rank > 0}
    finish, tokens, sent = out
    return RealResult(finish, trace.arrival.copy(), slo_arr[trace.model], tokens, stage_s, sent)


def profiled_specs(profile: LayerProfile, names: list[str]) -> dict[str, ModelSpec]:
    """The profiled model under each placed name (what the simulator places)."""
    return {m: profile.spec(profile.model) for m in names}
