"""Greedy EAGLE chain drafting as CUDA graphs: one replay per draft token, one host sync per draft.

Eagerly, each draft token cost a draft pass of ~35 launches plus its metadata, a softmax and a host
sync to pick the token: about what a graphed target step costs (docs/decisions.md#cuda-graphs), so
drafting ate what verification saved. Here the draft token never leaves the GPU:
per padded batch size two graphs are captured,
  head  f_hat -> the first token (argmax of the draft head over the final norm) and its probability
  step  (token, feature) -> the next feature through the draft layer -> the next token,
each reading the step's position, KV slot and attention limit from a [K, 3, B] table by a device-side
counter and writing the token and its probability into a [K, 2, B] history at the counter. The host
fills the table once, replays head and then step k - 1 times, and reads the history once.

Only greedy chains take this path (sampled drafts need their per-request generators on the host; trees
pick their beam on the host between levels): the drafter's eager path serves the rest. Every other
draft pass (the catch-up on the target's new features, a tree's levels) runs the same fused kernels
over static buffers (`forward_rows`), replayed as a graph captured at the pass's row count padded up
(as the target's steps are: padding rows write no KV and attend to nothing), and without a graph past
the largest (the catch-up on a whole prompt): launched one by one from Python, the ~14 kernels of a
catch-up pass cost more than the target's whole graph replay (docs/decisions.md#cuda-graphs). The
draft tokens are what the eager path would draft up to float rounding of the fused kernels, and never
change the output: verification decides.
"""
from __future__ import annotations

import types
from typing import Optional

import torch

from ..attention.triton_paged import attention_torch, attention_triton
from . import ops
from .buffers import NO_TREE, StaticInputs
from .plan import capture_sizes, padded_size

# The most rows a graphed draft pass takes: a catch-up after a verify step feeds 1 + accepted rows per
# sequence, a tree level beam rows per sequence; longer passes (a prompt's catch-up) run eagerly.
MAX_GRAPHED_ROWS = 64


class EagleChainGraphs:
    def __init__(self, drafter, max_seqs: int, max_model_len: int, max_draft: int = 33, max_rows: int = 2048,
                 capture: Optional[bool] = None, use_triton: Optional[bool] = None):
        """drafter: a drafters.eagle.EagleDrafter (its draft net, KV, head and the target's embeddings);
        max_draft: the longest draft (BASS's l_limit is 32); max_rows: the most rows forward_rows takes
        (longer passes: the drafter's eager path)."""
        net, dev = drafter.net, drafter.target.device
        cfg = net.cfg
        if any(lin.block is not None for lin in (net.fc, net.qkv, net.o, net.gate_up, net.down)):
            raise ValueError("graphed drafting needs the draft's dense projections (the CUDA path)")
        self.drafter, self.net, self.device = drafter, net, dev
        self.H, self.Hkv, self.D, self.eps = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps
        self.capture = dev.type == "cuda" if capture is None else capture
        use_triton = dev.type == "cuda" if use_triton is None else use_triton
        self.norm = ops.add_rms_norm_triton if use_triton else ops.add_rms_norm_torch
        self.rope_store = ops.rope_store_triton if use_triton else ops.rope_store_torch
        self.silu_mul = ops.silu_mul_triton if use_triton else ops.silu_mul_torch
        self.attend = attention_triton if use_triton else attention_torch
        self.sizes = capture_sizes(max_seqs)
        B, K = self.sizes[-1], max_draft
        self.block_size = drafter.kv.blocks.block_size
        self.max_blocks = -(-max_model_len // self.block_size)
        hidden = cfg.hidden_size
        self.K = K
        self.f = torch.zeros(B, hidden, dtype=torch.float32, device=dev)  # the feature fed next
        self.tok = torch.zeros(B, dtype=torch.long, device=dev)  # the token fed next (target ids)
        self.hist = torch.zeros(K, 2, B, dtype=torch.float32, device=dev)  # per draft token: (draft id, prob)
        self.counter = torch.zeros(1, dtype=torch.long, device=dev)
        # per draft step after the first: (position, KV slot, attention limit) of each request's row, then
        # the block tables; one host tensor, one copy per draft
        self._host = torch.zeros(K * 3 * B + B * self.max_blocks, dtype=torch.int32, pin_memory=dev.type == "cuda")
        self._dev = torch.zeros_like(self._host, device=dev)
        self.steps = self._dev[:K * 3 * B].view(K, 3, B)
        self.tables = self._dev[K * 3 * B:].view(B, self.max_blocks)
        self.seq = torch.arange(B, dtype=torch.int32, device=dev)
        self.span = torch.full((B,), NO_TREE, dtype=torch.int32, device=dev)
        self.tree = torch.zeros(B, 1, dtype=torch.int32, device=dev)
        self.graphs: dict[int, tuple] = {}
        self.counts = 0  # drafts made here
        self.rows_passes = 0  # passes through forward_rows
        # the catch-up after a prompt feeds the whole prompt: rows up to a prefill step's
        self.rows = StaticInputs(max_rows, max_seqs, self.max_blocks, 64, self.block_size, dev)
        self.row_sizes = capture_sizes(min(max_rows, MAX_GRAPHED_ROWS))
        self.feats = torch.zeros(max_rows, hidden, dtype=torch.float32, device=dev)  # forward_rows' input
        self.rows_out = torch.zeros(self.row_sizes[-1], hidden, dtype=torch.float32, device=dev)  # its graphs' output
        self.row_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.rows_graphed = 0  # forward_rows passes replayed as graphs (or padded, uncaptured)
        if self.capture:
            with torch.cuda.device(dev):
                self._capture()

    # --- the graph bodies -----------------------------------------------------------------------
    def _pick(self, f: torch.Tensor, n: int, at: torch.Tensor) -> None:
        """The draft head's greedy pick from features f [n, hidden] (DraftPicker's greedy branch), into
        the history at `at`, and what the next step feeds."""
        d = self.drafter
        probs = torch.softmax(d._logits(f).float(), dim=-1)  # [n, V_draft]
        conf, idx = probs.max(-1)
        self.hist.index_copy_(0, at, _pad_row(idx, conf, self.hist.shape[2]))
        self.f[:n].copy_(f)
        self.tok[:n].copy_(idx if d.vocab_ids is None else d.vocab_ids[idx])

    def _head(self, n: int) -> None:
        self._pick(self.f[:n].clone(), n, self.counter)

    def _step(self, n: int) -> None:
        """One draft pass for n rows, reading its step's row of the table."""
        cur = self.steps.index_select(0, self.counter)[0]  # [3, B]
        inp = types.SimpleNamespace(seq=self.seq, limit=cur[2], tables=self.tables, span_start=self.span,
                                    tree=self.tree, block_size=self.block_size, max_span=1)
        f = self.eagle_pass(self.tok[:n], self.f[:n], cur[0, :n], cur[1, :n], inp)
        self._pick(f, n, self.counter + 1)
        self.counter.add_(1)

    def eagle_pass(self, ids: torch.Tensor, feats: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                   inp) -> torch.Tensor:
        """One draft pass (EagleServing.forward with the fused ops), graph-safe: ids [T] (target ids) and
        the features before them [T, hidden] float32 at positions [T], their K/V written to slots [T]
        (-1: nowhere), inp: the attention's inputs as StaticInputs names them (seq, limit, tables,
        span_start, tree, block_size, max_span) -> predicted features [T, hidden] float32."""
        net, d = self.net, self.drafter
        H, Hkv, D = self.H, self.Hkv, self.D
        T = ids.shape[0]
        kc, vc = d.kv.cache.k[0], d.kv.cache.v[0]
        x = net.fc(torch.cat([d.target.embed_rows(ids).float(), feats], dim=-1))  # [T, hidden]
        x, h = self.norm(x, None, net.attn_norm, self.eps)
        qkv = net.qkv(h)
        rot = d.target.rotary
        self.rope_store(qkv, positions, rot.cos, rot.sin, kc, vc, slots, H, Hkv, D)
        a = self.attend(qkv[:, :H * D].view(T, H, D), kc, vc, inp, D ** -0.5)
        x, h = self.norm(x, net.o(a.reshape(T, H * D)), net.ffn_norm, self.eps)
        return x + net.down(self.silu_mul(net.gate_up(h)))

    def _rows(self, T: int) -> torch.Tensor:
        """One draft pass over the first T rows of `rows` and `feats` -> predicted features [T, hidden]."""
        inp = self.rows
        return self.eagle_pass(inp.ids[:T], self.feats[:T], inp.positions[:T], inp.slots[:T], inp)

    def _rows_graph_body(self, T: int) -> None:
        self.rows_out[:T].copy_(self._rows(T))

    def _capture(self) -> None:
        self._fill_padding()
        pool = None
        self.rows.clear()  # every row padding
        for T in reversed(self.row_sizes):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.inference_mode():
                self._rows_graph_body(T)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool), torch.inference_mode():
                self._rows_graph_body(T)
            pool = g.pool()
            self.row_graphs[T] = g
        for n in reversed(self.sizes):
            pair = []
            for body in (self._head, self._step):
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side), torch.inference_mode():
                    self.counter.zero_()
                    body(n)
                torch.cuda.current_stream().wait_stream(side)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=pool), torch.inference_mode():
                    body(n)
                pool = g.pool()
                pair.append(g)
            self.graphs[n] = tuple(pair)
        self.counter.zero_()
        torch.cuda.synchronize()

    def _fill_padding(self) -> None:
        """Every row padding: no KV written, nothing attended (what graphs are captured with)."""
        h = self._host.numpy()
        h[:] = 0
        steps = h[:self.K * 3 * len(self.seq)].reshape(self.K, 3, -1)
        steps[:, 1] = -1
        steps[:, 2] = -1
        self._dev.copy_(self._host)

    # --- any draft pass, without a graph ----------------------------------------------------------
    def rows_fit(self, q_lens, kv_lens, tables, trees) -> bool:
        return sum(q_lens) <= self.rows.max_tokens and self.rows.fits(q_lens, tables, trees)

    @torch.inference_mode()
    def forward_rows(self, feats: torch.Tensor, tokens: list[int], positions: list[int], q_lens: list[int],
                     kv_lens: list[int], tables: list[list[int]], trees) -> torch.Tensor:
        """EagleServing.forward with the fused kernels over static buffers: feats [T, hidden] and the
        tokens that follow them (target ids), per request its rows' span (AttentionMetadata's q_lens,
        kv_lens, block tables, span_parents) -> predicted features [T, hidden] (a tensor of its own:
        a tree's levels keep their rows past the next pass). Replays the graph of the padded row count
        where one fits (uncaptured: its body at that count, which the CPU tests check)."""
        T = len(tokens)
        size = padded_size(T, self.row_sizes)
        self.rows.fill(tokens, positions, q_lens, kv_lens, tables, trees, size or T)
        self.feats[:T].copy_(feats)
        self.rows_passes += 1
        if size is None:
            return self._rows(T)
        self.rows_graphed += 1
        if self.capture:
            self.row_graphs[size].replay()
        else:
            self._rows_graph_body(size)
        return self.rows_out[:T].clone()

    # --- drafting -----------------------------------------------------------------------------
    def fits(self, requests, max_len: int) -> bool:
        return 1 <= max_len <= self.K and len(requests) <= self.sizes[-1] \
            and all(len(self.drafter.kv.tables[r.request_id]) <= self.max_blocks for r in requests)

    @torch.inference_mode()
    def draft(self, requests, f_hat: torch.Tensor, max_len: int) -> tuple[list[list[int]], list[list[float]]]:
        """Greedy chains of max_len tokens for the requests, after the catch-up's features f_hat
        [n, hidden]: (draft tokens as target ids, their draft probabilities) per request."""
        n = len(requests)
        size = padded_size(n, self.sizes)
        B = len(self.seq)
        h = self._host.numpy()
        steps = h[:self.K * 3 * B].reshape(self.K, 3, B)
        tables = h[self.K * 3 * B:].reshape(B, self.max_blocks)
        bs = self.block_size
        for b, r in enumerate(requests):
            table = self.drafter.kv.tables[r.request_id]
            tables[b, :len(table)] = table
            for j in range(max_len - 1):  # draft step j feeds position N - 1 + j
                p = r.num_tokens - 1 + j
                steps[j, 0, b], steps[j, 1, b], steps[j, 2, b] = p, table[p // bs] * bs + p % bs, p
        steps[:max_len - 1, 0, n:size] = 0
        steps[:max_len - 1, 1:, n:size] = -1
        self._dev.copy_(self._host, non_blocking=True)
        self.f[:n].copy_(f_hat)
        self.counter.zero_()
        if self.capture:
            head, step = self.graphs[size]
            head.replay()
            for _ in range(max_len - 1):
                step.replay()
        else:
            self._head(size)
            for _ in range(max_len - 1):
                self._step(size)
        out = self.hist[:max_len, :, :n].cpu()  # the one sync of the draft
        vocab = self.drafter.picker.vocab_list
        ids = out[:, 0].long().T.tolist()
        conf = out[:, 1].T.tolist()
        self.counts += 1
        return [[vocab[t] for t in row] if vocab is not None else row for row in ids], conf


def _pad_row(idx: torch.Tensor, conf: torch.Tensor, width: int) -> torch.Tensor:
    """[1, 2, width]: (idx, conf) of n rows, zero past them."""
    row = torch.zeros(1, 2, width, dtype=torch.float32, device=idx.device)
    row[0, 0, :idx.shape[0]] = idx.float()
    row[0, 1, :idx.shape[0]] = conf
    return row
