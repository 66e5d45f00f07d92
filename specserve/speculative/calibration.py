"""Calibration: timing the target's bare passes on this machine, once, at start-up. The cost model
(cost_model.py) stays a table of numbers; what fills it from real passes lives here:

  - `calibrate`: bare target passes over 1..64 rows, the step-time curve speculation starts from;
  - `measure_prefill_chunk`: the prefill chunk for decode-maximal batching (SARATHI), below;
  - `time_pass`: one timed pass, what both are built on.

The prefill chunk: SARATHI splits prompts into chunks that ride with the running decodes, so a long
prompt never stalls them for a whole prefill. The chunk should be as small as possible (each step with
a chunk delays every running sequence's next token by the chunk's pass) and as large as needed for
prefill to run at full rate (a pass has a fixed cost: reading every weight once). On a GPU the knee is
where the hybrid batch saturates compute; on this CPU it is where the per-token cost of a prompt pass
stops falling. So: time prompt passes of growing sizes once per process and model, stop where doubling
the pass gains less than `tolerance` (the curve has flattened: a 1.5B model on the block kernels is
compute-bound from ~16 rows, and timing its 256-token pass alone would take seconds), and take the
smallest size whose tokens per second are within `tolerance` of the best measured.
"""
from __future__ import annotations

import time
from typing import Callable

import torch

from ..attention.paged import AttentionMetadata
from .cost_model import CostModel


def time_pass(model, kv, table: list[int], n: int, context: int = 0, mode: str = "split", repeats: int = 1,
              every_row: bool = True) -> float:
    """Seconds of the fastest of `repeats` bare target passes over n rows at positions context ..
    context + n - 1 (table: a scratch block table holding them; every_row: logits at every row, as a
    verify span needs, else at the last only, as a prompt chunk)."""
    dev = model.device
    meta = AttentionMetadata.build([n], [context + n], [table], kv.block_size, dev, mode=mode)
    ids = torch.zeros(n, dtype=torch.long, device=dev)
    pos = torch.arange(context, context + n, device=dev)
    rows = torch.arange(n, device=dev) if every_row else torch.tensor([n - 1], device=dev)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        logits = model.forward(ids, pos, meta, kv.k, kv.v, rows)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
        del logits
    return best


# Rows per calibrated pass: powers of two, the cost model interpolating between them and extending the
# last two's slope beyond (a pass's cost is close to linear in its rows past a few on CPU, flat on a
# GPU); docs/decisions.md#calibration.
CALIBRATION_ROWS = (1, 2, 4, 8, 16, 32)
# Retakes when plain steps show the calibration was disturbed (CostModel.calibration_disturbed).
RETAKES = 2


def calibrate(costs: CostModel, model, kv, blocks, attention: str, plain_attention: str, max_rows: int,
              context: int = 128, rows=CALIBRATION_ROWS, time_fn=None) -> None:
    """Time bare target passes over 1..32 rows once, so the cost model starts from measured numbers
    (it keeps measuring while serving). model: the target; kv: its KVCache; blocks: its BlockManager
    (a scratch table is taken and given back); attention: the verify spans' mode, plain_attention:
    one-row steps' (engine/runner.py); max_rows: the scheduler's token budget. time_fn(table, n,
    context, mode, repeats): how a pass is timed where the engine's runner does not run the model's
    own forward (engine/graph_runner.py: CUDA graphs, ~20x below the eager pass on an H200)."""
    rows = [n for n in rows if n <= max_rows]
    table: list[int] = []
    if not rows or not blocks.can_allocate(table, context + max(rows)):
        return
    blocks.allocate(table, context + max(rows))
    try:
        for n in [1] + rows:  # the first pass warms up
            # the fastest of three: a one-off stall would bend the whole curve
            mode = attention if n > 1 else plain_attention
            seconds = time_fn(table, n, context, mode, 3) if time_fn else time_pass(model, kv, table, n, context, mode, 3)
            costs.record_calibration(n, seconds)
    finally:
        blocks.free(table)


class Calibrator:
    """Takes the calibration (`take`), and takes it again, at most RETAKES times, when the steps served
    since show it was disturbed: a calibration taken while the machine was busy priced every verify
    row too high and kept drafting off for a whole session (issue 40). run: the calibration itself
    (calibrate with its arguments bound); a retake happens between steps, when its scratch blocks
    are free (calibrate skips it otherwise)."""

    def __init__(self, costs: CostModel, run: Callable[[], None]):
        self.costs, self.run = costs, run
        self.retakes = 0

    def take(self) -> None:
        old = dict(self.costs.calibrated), dict(self.costs.scale)
        self.costs.reset_calibration()
        self.run()
        if not self.costs.calibrated:  # no room for its scratch blocks (the KV is full): keep the old curve
            self.costs.calibrated.update(old[0])
            self.costs.scale.update(old[1])

    def check(self) -> bool:
        """After a step: retake the calibration if it looks disturbed; True when it did."""
        if self.retakes >= RETAKES or not self.costs.calibration_disturbed():
            return False
        self.retakes += 1
        self.take()
        return True


CHUNK_SIZES = (16, 32, 64, 128, 256)  # prompt tokens per timed pass (capped by the step's token budget)
# (model, dtype, device, blocks, activations, threads, graphs, KV cache dtype, budget) -> chunk: once per process
_measured: dict[tuple, int] = {}


def measure_prefill_chunk(key: tuple, model, kv, blocks, max_tokens: int, tolerance: float = 0.1,
                          time_fn=None) -> int:
    """The prefill chunk for this machine (see the module doc). key identifies the model setup (the
    measurement is kept for the process); kv: the target's KVCache; blocks: its BlockManager (a
    scratch table is taken and given back); max_tokens: the scheduler's token budget per step.
    time_fn(table, n, repeats): seconds of the fastest of `repeats` prompt passes of n tokens the way
    the engine's runner serves them (engine/graph_runner.py: graphs up to 16 tokens, the fused kernels
    past them), each size timed twice: a size's first pass on a GPU also pays for the library's kernel
    pick, and one pass a size read a flat curve as a falling one (16 tokens a step on an H100,
    docs/decisions.md#device-rounds). None: the model's own forward, once a size."""
    key = key + (max_tokens,)
    if key in _measured:
        return _measured[key]
    sizes = [n for n in CHUNK_SIZES if n <= max_tokens] or [max_tokens]
    table: list[int] = []
    if not blocks.can_allocate(table, max(sizes)):
        return max(sizes)
    blocks.allocate(table, max(sizes))
    rate: dict[int, float] = {}  # tokens per second
    if time_fn is None:
        time_fn = lambda table, n, repeats: time_pass(model, kv, table, n, every_row=False, repeats=repeats)  # noqa: E731
        repeats = 1
    else:
        repeats = 2
    try:
        time_fn(table, sizes[0], 1)  # warm-up
        for i, n in enumerate(sizes):
            rate[n] = n / time_fn(table, n, repeats)
            if i and rate[n] < (1 + tolerance) * rate[sizes[i - 1]]:
                break
    finally:
        blocks.free(table)
    best = max(rate.values())
    chunk = min(n for n in rate if rate[n] >= (1 - tolerance) * best)
    _measured[key] = chunk
    return chunk
