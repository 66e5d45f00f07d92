"""ModelRunner with CUDA graphs: decode and verify steps replay a graph captured at the next token
count up (cuda/plan.py), over static input buffers; prefill and mixed steps run the same fused
kernels eagerly (9 ops a layer instead of the torch path's ~35; docs/decisions.md#cuda-graphs), or the
model's own forward where the step does not fit the buffers or Triton is missing.

This is vLLM's CUDA-graph runner in the engine's terms: graphs are captured once at start, largest
first so the smaller ones share its memory pool; a step pads its tokens up to a captured size; the
graph's outputs are static tensors, copied out before the next replay can overwrite them.
"""
from __future__ import annotations

import time
from collections import Counter
from typing import Optional

import torch

from ..attention import triton_paged
from ..cuda.buffers import StaticInputs
from ..cuda.forward import StaticForward
from ..cuda.graphs import capture_graphs
from ..cuda.plan import MAX_GRAPH_Q, capture_sizes, padded_size
from ..kv.cache import KVCache
from ..scheduler.scheduler import ScheduledRequest
from ..types import Draft, Request, SamplingParams
from .runner import ModelRunner, StepLayout, StepOutput

MAX_GRAPH_SPAN = 64  # the longest token tree (rows) a graphed step takes; the tree-mask buffer's width


class GraphModelRunner(ModelRunner):
    def __init__(self, model, kv_cache: KVCache, device: torch.device, attention: str = "split",
                 plain_attention: Optional[str] = None, max_seqs: int = 64, max_model_len: int = 2048,
                 max_graph_tokens: int = 128, max_step_tokens: int = 0, capture: Optional[bool] = None,
                 use_triton: Optional[bool] = None, invariant: bool = False):
        """max_step_tokens: the most tokens a step may bring (the scheduler's budget); steps past the
        graphs up to it run the fused kernels eagerly when use_triton. capture: record CUDA graphs
        (default: on CUDA); without, static steps run their kernels eagerly (what the CPU tests
        check). use_triton: the fused Triton ops (default: when triton imports and the device is CUDA).
        invariant: batch-invariant projections (cuda/linear.py)."""
        super().__init__(model, kv_cache, device, attention, plain_attention)
        self.sizes = capture_sizes(max_graph_tokens)
        bs = kv_cache.block_size
        if use_triton is None:
            use_triton = triton_paged.available() and device.type == "cuda"
        self.fused_eager = use_triton
        rows = max(self.sizes[-1], max_step_tokens if use_triton else 0)
        self.inputs = StaticInputs(rows, max_seqs, -(-max_model_len // bs), MAX_GRAPH_SPAN, bs, device)
        self.static = StaticForward(model, kv_cache.k, kv_cache.v, self.inputs, use_triton, invariant)
        # the graphs' outputs, shared by all of them
        top = self.sizes[-1]
        self.out = (torch.empty(top, model.lm_head.dense.shape[0], dtype=torch.float32, device=device),
                    torch.empty(top, model.arch.hidden_size, dtype=model.dtype, device=device))
        self.capture = device.type == "cuda" if capture is None else capture
        self.graphs: dict[int, tuple] = {}  # size -> (CUDAGraph, logits [size, V], hidden [size, hidden])
        self.counts: Counter = Counter()  # steps by path: "graph", "fused" (eager, fused kernels), "eager"
        self.capture_s = 0.0
        if self.capture:
            self.capture_all()

    def capture_all(self) -> None:
        """Capture every size with all-padding inputs (no KV is read or written)."""
        with torch.cuda.device(self.device):
            self._capture_all()

    def _capture_all(self) -> None:
        t0 = time.perf_counter()
        self.graphs = capture_graphs(self.static, self.sizes, self.out)
        self.capture_s = time.perf_counter() - t0

    def time_pass(self, table: list[int], n: int, context: int, mode: str = "pad", repeats: int = 1,
                  prompt: bool = False) -> float:
        """cost_model.time_pass through this runner: seconds of the fastest of `repeats` steps of one
        span of n rows after `context` tokens (the last n - 1 as a draft: logits at every row, as a
        verify span; prompt: a prompt chunk, logits at its last row), on the graph or the fused path
        the span would take when serving."""
        r = Request("calibrate", [0] * (context + (n if prompt else 1)), SamplingParams(temperature=0))
        r.block_table = table
        step = [ScheduledRequest(r, context, n, Draft([0] * (n - 1)) if n > 1 and not prompt else None)]
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = self.execute(step)
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
            del out
        return best

    def graph_size(self, lay: StepLayout) -> Optional[int]:
        """The captured size this step replays, or None (eager): prompt chunks, or past the buffers."""
        if not lay.q_lens or max(lay.q_lens) > MAX_GRAPH_Q or not self.inputs.fits(lay.q_lens, lay.tables, lay.trees):
            return None
        return padded_size(len(lay.token_ids), self.sizes)

    def execute(self, scheduled: list[ScheduledRequest], return_hidden: bool = False) -> StepOutput:
        lay = self.layout(scheduled)
        T = len(lay.token_ids)
        size = self.graph_size(lay)
        if size is None:
            if not (self.fused_eager and self.inputs.fits(lay.q_lens, lay.tables, lay.trees)):
                self.counts["eager"] += 1
                return self.run_eager(scheduled, lay, return_hidden)
            # a prompt chunk (or a mixed step): the fused kernels without a graph, logits for its rows only
            self.counts["fused"] += 1
            self.inputs.fill(lay.token_ids, lay.positions, lay.q_lens, lay.kv_lens, lay.tables, lay.trees, T)
            rows = torch.tensor(lay.logits_rows, dtype=torch.long, device=self.device)
            out_logits, hidden = self.static(T, rows)
            return self._output(scheduled, lay, out_logits, hidden if return_hidden else None)
        self.counts["graph"] += 1
        self.inputs.fill(lay.token_ids, lay.positions, lay.q_lens, lay.kv_lens, lay.tables, lay.trees, size)
        if self.capture:
            graph, logits, hidden = self.graphs[size]
            graph.replay()
        else:
            logits, hidden = self.static(size, out=self.out)
        # copies: the next replay overwrites the graph's outputs, and drafters keep hidden rows
        if lay.logits_rows == list(range(T)):
            out_logits = logits[:T].clone()
        else:
            out_logits = logits.index_select(0, torch.tensor(lay.logits_rows, dtype=torch.long, device=self.device))
        return self._output(scheduled, lay, out_logits, hidden[:T].clone() if return_hidden else None)

    def _output(self, scheduled: list[ScheduledRequest], lay: StepLayout, out_logits: torch.Tensor,
                out_hidden: Optional[torch.Tensor]) -> StepOutput:
        T = len(lay.token_ids)
        if out_hidden is not None and self.kv.features is not None:  # beside the KV, for prefix-cache hits
            self.kv.features.index_copy_(0, self.inputs.slots[:T].long(), out_hidden.float())
        return StepOutput(list(scheduled), out_logits, out_hidden, lay.rows)
