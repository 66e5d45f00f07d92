"""Capturing a static forward (cuda/forward.py) as one CUDA graph per token count, as vLLM's runner
does: shared by the target's steps (engine/graph_runner.py) and a draft model's passes
(cuda/draft_graph.py)."""
from __future__ import annotations

from typing import Sequence

import torch

from .forward import StaticForward


def capture_graphs(static: StaticForward, sizes: Sequence[int],
                   out: tuple[torch.Tensor, torch.Tensor]) -> dict[int, tuple]:
    """One graph per token count in `sizes`, over all-padding inputs (no KV is read or written),
    largest first so that the smaller ones share its memory pool. Each size runs once on a side
    stream before its capture: Triton compiles its kernels there and cuBLAS picks its algorithms for
    the size. out: the logits [>= max size, V] and hidden [>= max size, hidden] buffers every graph
    writes into (StaticForward's `out`). -> size -> (graph, logits [size, V], hidden [size, hidden])."""
    static.inputs.clear()
    graphs: dict[int, tuple] = {}
    pool = None
    for size in sorted(sizes, reverse=True):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            static(size, out=out)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            logits, hidden = static(size, out=out)
        pool = graph.pool()
        graphs[size] = (graph, logits, hidden)
    torch.cuda.synchronize()
    return graphs
