"""The prefill chunk for decode-maximal batching (SARATHI), measured on this machine.

SARATHI splits prompts into chunks that ride with the running decodes, so a long prompt never stalls
them for a whole prefill. The chunk should be as small as possible (each step with a chunk delays
every running sequence's next token by the chunk's pass) and as large as needed for prefill to run
at full rate (a pass has a fixed cost: reading every weight once). On a GPU the knee is where the
hybrid batch saturates compute; on this CPU it is where the per-token cost of a prompt pass stops
falling. So: time prompt passes of growing sizes once per process and model, stop where doubling
the pass gains less than `tolerance` (the curve has flattened: a 1.5B model on the block kernels is
compute-bound from ~16 rows, and timing its 256-token pass alone would take seconds), and take the
smallest size whose tokens per second are within `tolerance` of the best measured.
"""
from __future__ import annotations

from ..spec import time_pass

SIZES = (16, 32, 64, 128, 256)  # prompt tokens per timed pass (capped by the step's token budget)
_measured: dict[tuple, int] = {}  # (model, dtype, device, threads, budget) -> chunk: once per process


def measure_prefill_chunk(key: tuple, model, kv, blocks, max_tokens: int, tolerance: float = 0.1) -> int:
    """The prefill chunk for this machine (see the module doc). key identifies the model setup (the
    measurement is kept for the process); kv: the target's KVCache; blocks: its BlockManager (a
    scratch table is taken and given back); max_tokens: the scheduler's token budget per step."""
    key = key + (max_tokens,)
    if key in _measured:
        return _measured[key]
    sizes = [n for n in SIZES if n <= max_tokens] or [max_tokens]
    table: list[int] = []
    if not blocks.can_allocate(table, max(sizes)):
        return max(sizes)
    blocks.allocate(table, max(sizes))
    rate: dict[int, float] = {}  # tokens per second
    try:
        time_pass(model, kv, table, sizes[0], every_row=False)  # warm-up
        for i, n in enumerate(sizes):
            rate[n] = n / time_pass(model, kv, table, n, every_row=False)
            if i and rate[n] < (1 + tolerance) * rate[sizes[i - 1]]:
                break
    finally:
        blocks.free(table)
    best = max(rate.values())
    chunk = min(n for n in rate if rate[n] >= (1 - tolerance) * best)
    _measured[key] = chunk
    return chunk
