"""A standalone draft model's passes (drafters/draft_model.py) as CUDA graphs.

A draft model drafts k tokens in k passes of one row per sequence, then catches up on the 1 +
accepted tokens of the verify step: k + 1 small passes per step, each ~35 launches a layer when run
eagerly (docs/decisions.md#cuda-graphs), where the target's verify pass is one graph replay. These
passes run cuda/forward.py's static forward over the draft's own KV (drafters/common.DraftKV) and
buffers, replayed as a graph captured at the pass's row count padded up, as the target's steps are
(engine/graph_runner.py): padding rows write no KV and attend to nothing. A tree level is such a
pass too, its rows' ancestor mask in the buffers. Passes past the graphs (a prompt's catch-up, a span
longer than cuda/plan.MAX_GRAPH_Q) return None and the drafter runs them eagerly.

Logits come from the draft's reduced head where it has one (LlamaModel.head_rows). The drafts are
what the eager passes draft up to float rounding of the fused kernels, and never change the output:
verification decides.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from .buffers import StaticInputs
from .forward import StaticForward
from .graphs import capture_graphs
from .plan import StepShape, capture_sizes, graph_size

# The most rows a graphed draft pass takes (as cuda/eagle_graph.MAX_GRAPHED_ROWS): B sequences' one-row
# passes, their catch-ups of 1 + accepted rows, a tree level's beam rows each; also the widest tree.
MAX_ROWS = 64


class DraftModelGraphs:
    def __init__(self, model, kv, max_seqs: int, max_model_len: int, vocab: int,
                 head: Optional[Callable[[torch.Tensor], torch.Tensor]] = None, max_rows: int = MAX_ROWS,
                 capture: Optional[bool] = None, use_triton: Optional[bool] = None):
        """model: the draft's models.llama.LlamaModel (dense projections); kv: its DraftKV; vocab: the
        width of its logits (V', the reduced head's rows where `head` is given: LlamaModel.head_rows);
        capture: record CUDA graphs (default: on CUDA; without, a pass runs the same static forward
        uncaptured at the padded size, which the CPU tests check); use_triton: the fused Triton ops
        (default: on CUDA) or their torch references."""
        dev = model.device
        self.capture = dev.type == "cuda" if capture is None else capture
        use_triton = dev.type == "cuda" if use_triton is None else use_triton
        self.sizes = capture_sizes(max_rows)
        bs = kv.blocks.block_size
        self.inputs = StaticInputs(self.sizes[-1], max_seqs, -(-max_model_len // bs), max_rows, bs, dev)
        self.static = StaticForward(model, kv.cache.k, kv.cache.v, self.inputs, use_triton, head=head)
        top = self.sizes[-1]
        self.out = (torch.empty(top, vocab, dtype=torch.float32, device=dev),
                    torch.empty(top, model.arch.hidden_size, dtype=model.dtype, device=dev))
        self.graphs: dict[int, tuple] = {}  # size -> (CUDAGraph, logits [size, V'], hidden)
        self.passes = 0  # passes run here (the rest ran eagerly)
        self.tree_passes = 0  # of which a token tree's level
        if self.capture:
            with torch.cuda.device(dev):
                self.graphs = capture_graphs(self.static, self.sizes, self.out)

    def size(self, q_lens: Sequence[int], tables: Sequence[Sequence[int]], trees: Sequence) -> Optional[int]:
        """The captured size a pass replays, or None when it runs eagerly."""
        span = max((len(p) for p in trees if p is not None), default=0)
        size = graph_size(StepShape(tuple(q_lens), span), self.sizes, self.inputs.max_seqs, self.inputs.max_span)
        return size if size is not None and self.inputs.fits(q_lens, tables, trees) else None

    @torch.inference_mode()
    def forward(self, tables: Sequence[Sequence[int]], ids: Sequence[int], positions: Sequence[int],
                q_lens: Sequence[int], kv_lens: Sequence[int], span_parents: Optional[Sequence],
                rows: torch.Tensor) -> Optional[torch.Tensor]:
        """One draft pass, its arguments as DraftModelDrafter._forward's (tables: each request's KV
        block table; rows [S]: the pass's rows whose logits are wanted) -> logits [S, V'] float32 (a
        tensor of its own: the next replay overwrites the graph's), or None where the pass does not fit
        a graph."""
        trees = list(span_parents) if span_parents is not None else [None] * len(q_lens)
        size = self.size(q_lens, tables, trees)
        if size is None:
            return None
        self.inputs.fill(ids, positions, q_lens, kv_lens, tables, trees, size)
        self.passes += 1
        self.tree_passes += any(p is not None for p in trees)
        if self.capture:
            graph, logits, _ = self.graphs[size]
            graph.replay()
        else:
            logits, _ = self.static(size, out=self.out)
        return logits.index_select(0, rows)
