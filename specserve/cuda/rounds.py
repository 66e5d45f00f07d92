"""Greedy rounds kept on the GPU: M rounds of (EAGLE draft -> verify -> accept) per host sync.

On a lent H100 a graphed speculative step took 2.2-2.5 ms against 1.13 ms for a regular one, though
its GPU work was about 1.3 ms (bench/results/gpu/README.md): the rest was the host between the
draft, the target's pass and the acceptance (three syncs, Python per sequence). Here one round is
one CUDA graph whose inputs are all computed on the device from the round before, M rounds replay
back to back, and the host reads the tokens once: vLLM's multi-step scheduling, with EAGLE inside.

State per sequence b (rows of padding have live False: they write no KV and attend to nothing):
  L[b]      tokens in the target's KV (positions < L); the last token, last[b], is at position L
  c[b]      target features the draft has not fed yet: positions L - c .. L - 1, P[b, :c] (float32),
            each with the token after it, Ptok[b, :c]; 1 <= c <= 1 + K
A round, R = 1 + K rows per sequence:
  catch-up  draft rows (P[b, i], Ptok[b, i]) at positions L - c + i for i < c -> f_hat, row c - 1's
  draft     d_1 = argmax head(f_hat); d_(j+1) from the chain step (f_hat, d_j) at position L + j - 1
  verify    target rows [last, d_1 .. d_K] at positions L .. L + K -> argmax a [R], hidden [R]
  accept    n = the leading run of d_j == a_(j-1). The new tokens are a_0 .. a_n (an accepted draft
            token is the target's own argmax), so Ptok = a, P = hidden, c = n + 1, L += n + 1,
            last = a_n.
With K = 0 (no drafter) a round is one regular decode step. A row's argmax is the token regular
decoding picks at that position after the same context: exactly in float32; in bfloat16 up to the
rounding of a product of R rows per sequence against regular decoding's one (README, GPU section).
A sequence that stops during the M rounds goes on computing into its reserved KV slots; the host
drops its tokens past the stop.

Runs queue: `launch` starts one from the host's state, `extend` queues the next from where the last
leaves the device state (outputs alternate between two slots), `collect` waits for one run only, so
the host appends one run's tokens while the next computes (engine/rounds.py).
"""
from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from .buffers import NO_TREE
from .plan import capture_sizes, padded_size


@dataclass
class RoundsInput:
    """One sequence's start (from the scheduler's and the drafter's state)."""

    num_computed: int  # L: tokens in the target's KV
    last_token: int
    table: list[int]  # the target's block table, covering positions < L + M (1 + K)
    draft_table: Optional[list[int]] = None  # the draft's, likewise (with a drafter)
    feats: Optional[torch.Tensor] = None  # [c, hidden]: the target features the draft has not fed
    feat_tokens: Optional[list[int]] = None  # [c]: the token after each of them


@dataclass
class RoundsOutput:
    tokens: list[list[int]]  # per sequence, every round's new tokens in order
    counts: list[list[int]]  # per sequence, new tokens per round (1 + accepted drafts)


@dataclass
class Flight:
    """A run of rounds queued on the device: its output slot (runs alternate between two, so one can
    be read while the next runs), padded and real sequences, rounds, and where its tokens land."""

    slot: int
    size: int
    n: int
    rounds: int
    host: torch.Tensor  # pinned: [rounds n R] tokens, then [rounds n] counts
    events: Optional[list]  # CUDA events: start, end (the tokens copied)
    live: np.ndarray  # [n] bool: rows still computed for (a dead row writes nothing, its tokens are noise)


class DeviceRounds:
    def __init__(self, runner, chain_graphs=None, draft_len: int = 3, max_rounds: int = 8, max_seqs: int = 16,
                 capture: Optional[bool] = None):
        """runner: an engine.graph_runner.GraphModelRunner (its model, KV, static inputs and forward);
        chain_graphs: a cuda.eagle_graph.EagleChainGraphs (the EAGLE drafter's graph-safe pass), None
        for regular decoding; draft_len: K; max_rounds: M at most per run."""
        self.runner, self.g = runner, chain_graphs
        self.K = draft_len if chain_graphs is not None else 0
        R = self.K + 1
        self.R, self.M = R, max_rounds
        inp = runner.inputs
        self.device = dev = runner.device
        self.sizes = capture_sizes(max(1, min(max_seqs, inp.max_seqs, runner.out[0].shape[0] // R)))
        B = self.sizes[-1]
        self.max_seqs = B
        hidden = runner.model.arch.hidden_size
        self.bs = inp.block_size
        long = dict(dtype=torch.long, device=dev)
        self.L, self.c, self.last = torch.zeros(B, **long), torch.ones(B, **long), torch.zeros(B, **long)
        self.live = torch.zeros(B, dtype=torch.bool, device=dev)
        self.P = torch.zeros(B, R, hidden, dtype=torch.float32, device=dev)
        self.Ptok = torch.zeros(B, R, **long)
        # outputs, by round: two runs' worth (slot 0: rows < M, slot 1: rows M .. 2M - 1)
        self.out_tok = torch.zeros(2 * max_rounds, B, R, **long)
        self.out_n = torch.zeros(2 * max_rounds, B, **long)
        self.hist = torch.zeros(2 * max_rounds, B, R, hidden, dtype=torch.float32, device=dev)  # for kv.features
        self.state = torch.zeros(3, B, **long)  # uploaded at a launch: L, last, c
        self.alive = torch.zeros(1, B, **long)  # uploaded with every run: 1 for a row still computed
        self._pin = dev.type == "cuda"
        self._pinned: dict = {}  # pinned host buffers, by (slot, what): a slot's are reused two runs later
        self._slot = 1
        self.counter = torch.zeros(1, **long)
        self.ar = torch.arange(R, **long)
        self.rows_seq = torch.arange(B, dtype=torch.int32, device=dev).repeat_interleave(R)  # [B R]: each row's sequence
        self.seq1 = torch.arange(B, dtype=torch.int32, device=dev)
        if chain_graphs is not None:
            self.d_tables = torch.zeros(B, chain_graphs.max_blocks, dtype=torch.int32, device=dev)
            self.span = torch.full((B * R,), NO_TREE, dtype=torch.int32, device=dev)
            self.tree = torch.zeros(B * R, 1, dtype=torch.int32, device=dev)
        self.capture = dev.type == "cuda" if capture is None else capture
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.rounds = self.drafted = self.accepted = 0  # over live sequences
        self.by_batch: dict[int, list] = {}  # sequences -> [rounds, live rows' rounds, their tokens, GPU seconds]
        if self.capture:
            with torch.cuda.device(dev):
                self._capture()

    # --- the graph body ---------------------------------------------------------------------------
    def _slots(self, tables: torch.Tensor, pos: torch.Tensor, ok: torch.Tensor) -> torch.Tensor:
        """KV slots of positions pos [n, r] through tables [n, blocks]; -1 where not ok."""
        blk = (pos // self.bs).clamp(max=tables.shape[1] - 1)
        s = tables.long().gather(1, blk) * self.bs + pos % self.bs
        return s.masked_fill(~ok, -1)

    def _draft_inputs(self, limit: torch.Tensor, rows: int, seq: torch.Tensor):
        return types.SimpleNamespace(seq=seq, limit=limit.int(), tables=self.d_tables, span_start=self.span[:rows],
                                     tree=self.tree, block_size=self.bs, max_span=1)

    def _pick(self, f: torch.Tensor) -> torch.Tensor:
        d = self.g.drafter
        idx = d._logits(f).argmax(-1)
        return idx if d.vocab_ids is None else d.vocab_ids[idx]

    def _draft(self, n: int) -> torch.Tensor:
        """The catch-up and a chain of K draft tokens for n sequences -> [n, K] target ids."""
        g, K, R = self.g, self.K, self.R
        L, c, live = self.L[:n], self.c[:n], self.live[:n]
        pos = ((L - c)[:, None] + self.ar).clamp(min=0)  # [n, R] (padding rows: L = 0 < c)
        ok = (self.ar[None, :] < c[:, None]) & live[:, None]
        slots = self._slots(self.d_tables[:n], pos, ok)
        inp = self._draft_inputs(pos.masked_fill(~ok, -1).reshape(-1), n * R, self.rows_seq[:n * R])
        f = g.eagle_pass(self.Ptok[:n].reshape(-1), self.P[:n].reshape(n * R, -1), pos.reshape(-1).int(),
                         slots.reshape(-1).int(), inp)  # [n R, hidden]
        f_hat = f.view(n, R, -1)[torch.arange(n, device=f.device), c - 1]  # [n, hidden]
        tok = self._pick(f_hat)
        out = [tok]
        for j in range(1, K):
            p = (L + j - 1)[:, None]  # [n, 1]
            s = self._slots(self.d_tables[:n], p, live[:, None])[:, 0]
            inp = self._draft_inputs(p[:, 0].masked_fill(~live, -1), n, self.seq1[:n])
            f_hat = g.eagle_pass(tok, f_hat, p[:, 0].int(), s.int(), inp)
            tok = self._pick(f_hat)
            out.append(tok)
        return torch.stack(out, 1)

    def _round(self, n: int) -> None:
        K, R = self.K, self.R
        run, inp = self.runner, self.runner.inputs
        L, live = self.L[:n], self.live[:n]
        d = self._draft(n) if K else None
        ids = self.last[:n, None] if d is None else torch.cat([self.last[:n, None], d], 1)  # [n, R]
        pos = L[:, None] + self.ar
        T = n * R
        inp.ids[:T].copy_(ids.reshape(-1))
        inp.positions[:T].copy_(pos.reshape(-1))
        inp.slots[:T].copy_(self._slots(inp.tables[:n], pos, live[:, None]).reshape(-1))
        inp.seq[:T].copy_(self.rows_seq[:T])
        inp.limit[:T].copy_(pos.masked_fill(~live[:, None], -1).reshape(-1))
        logits, hidden = run.static(T, out=run.out)
        a = logits.argmax(-1).view(n, R)
        if d is None:
            acc = torch.zeros(n, dtype=torch.long, device=a.device)
        else:
            acc = torch.cumprod((d == a[:, :K]).long(), 1).sum(1)  # [n] leading matches
        h = hidden.view(n, R, -1).float()
        self.out_tok[:, :n].index_copy_(0, self.counter, a[None])
        self.out_n[:, :n].index_copy_(0, self.counter, (acc + 1)[None])
        self.hist[:, :n].index_copy_(0, self.counter, h[None])
        self.P[:n].copy_(h)
        self.Ptok[:n].copy_(a)
        self.c[:n].copy_(acc + 1)
        self.last[:n].copy_(a.gather(1, acc[:, None])[:, 0])
        self.L[:n].add_(acc + 1)
        self.counter.add_(1)

    def _capture(self) -> None:
        self.live.zero_()
        inp = self.runner.inputs
        inp.span_start.fill_(NO_TREE)
        pool = None
        for n in reversed(self.sizes):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.inference_mode():
                self.counter.zero_()
                self._round(n)
            torch.cuda.current_stream().wait_stream(side)
            self.counter.zero_()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool), torch.inference_mode():
                self._round(n)
            pool = g.pool()
            self.graphs[n] = g
        self.counter.zero_()
        self.L.zero_()
        torch.cuda.synchronize()

    # --- running ----------------------------------------------------------------------------------
    def fits(self, num_seqs: int, num_blocks: int, draft_blocks: int = 0) -> bool:
        """Whether the buffers hold num_seqs sequences whose tables reach num_blocks blocks."""
        ok = 1 <= num_seqs <= self.max_seqs and num_blocks <= self.runner.inputs.max_blocks
        return ok and (self.g is None or draft_blocks <= self.d_tables.shape[1])

    def _upload(self, slot: int, host: np.ndarray, dst: torch.Tensor) -> None:
        """Copy host [rows, cols] into dst's first rows through slot's pinned buffer, without blocking:
        a pageable copy would wait for the run in flight, which is what a queued run must not do."""
        buf = self._pinned.setdefault((slot, dst.data_ptr()), torch.zeros(dst.shape, dtype=dst.dtype, pin_memory=self._pin))
        buf[:len(host)].copy_(torch.from_numpy(host))
        dst[:len(host)].copy_(buf[:len(host)], non_blocking=True)

    @torch.inference_mode()
    def launch(self, seqs: list[RoundsInput], rounds: int) -> Flight:
        """Queue `rounds` rounds (<= M) of the sequences from their host state; nothing waits."""
        n = len(seqs)
        size = padded_size(n, self.sizes)
        if size is None or not 1 <= rounds <= self.M:
            raise ValueError(f"{n} sequences, {rounds} rounds: past the buffers ({self.max_seqs}, {self.M})")
        slot = self._slot = 1 - self._slot
        state = np.zeros((3, self.max_seqs), dtype=np.int64)  # L, last, c
        state[2] = 1
        for b, s in enumerate(seqs):
            state[:, b] = (s.num_computed, s.last_token, 1 if s.feats is None else len(s.feats))
        self._upload(slot, state, self.state)
        self.L[:size].copy_(self.state[0, :size])
        self.last[:size].copy_(self.state[1, :size])
        self.c[:size].copy_(self.state[2, :size])
        if self.g is not None:
            for b, s in enumerate(seqs):
                self.P[b, :len(s.feats)].copy_(s.feats)
            self._upload(slot, _padded([s.feat_tokens for s in seqs], size, self.R, np.int64), self.Ptok)
        self.runner.inputs.span_start[:size].fill_(NO_TREE)
        return self._queue(slot, size, n, rounds, [s.table for s in seqs], [s.draft_table for s in seqs], np.ones(n, dtype=bool))

    @torch.inference_mode()
    def extend(self, flight: Flight, rounds: int, tables: list[list[int]], draft_tables: list, live: list[bool]) -> Flight:
        """Queue `rounds` more rounds of the sequences of `flight` (the last run queued), from where it
        leaves them on the device: their (grown) block tables, and live False for those that stopped."""
        if not 1 <= rounds <= self.M:
            raise ValueError(f"{rounds} rounds: past the buffers ({self.M})")
        slot = self._slot = 1 - self._slot
        return self._queue(slot, flight.size, flight.n, rounds, tables, draft_tables, np.asarray(live, dtype=bool))

    def _queue(self, slot: int, size: int, n: int, rounds: int, tables, draft_tables, live: np.ndarray) -> Flight:
        inp = self.runner.inputs
        self._upload(slot, _padded(tables, size, inp.max_blocks, np.int32), inp.tables)
        if self.g is not None:
            self._upload(slot, _padded(draft_tables, size, self.d_tables.shape[1], np.int32), self.d_tables)
        self._upload(slot, _padded([live], 1, self.max_seqs, np.int64), self.alive)
        self.live[:size].copy_(self.alive[0, :size] > 0)
        self.counter.fill_(slot * self.M)  # this run's rows of the outputs
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if self.capture else None
        if ev:
            ev[0].record()
        for _ in range(rounds):
            if self.capture:
                self.graphs[size].replay()
            else:
                self._round(size)
        a = slot * self.M
        out = torch.cat([self.out_tok[a:a + rounds, :n].reshape(-1), self.out_n[a:a + rounds, :n].reshape(-1)])
        host = self._pinned.setdefault(("out", slot), torch.zeros(self.out_tok[:self.M].numel() + self.out_n[:self.M].numel(),
                                                                 dtype=torch.long, pin_memory=self._pin))
        host[:len(out)].copy_(out, non_blocking=True)
        if ev:
            ev[1].record()
        return Flight(slot, size, n, rounds, host, ev, np.asarray(live[:n], dtype=bool))

    def collect(self, flight: Flight) -> RoundsOutput:
        """Wait for `flight` (only: a run queued behind it goes on) and read its tokens."""
        if flight.events:
            flight.events[1].synchronize()
        n, rounds, R = flight.n, flight.rounds, self.R
        host = flight.host[:rounds * n * (R + 1)]
        toks = host[:rounds * n * R].view(rounds, n, R).numpy()
        cnt = host[rounds * n * R:].view(rounds, n).numpy()
        alive, got = int(flight.live.sum()), int(cnt[:, flight.live].sum())  # statistics of the live rows only
        self.rounds += rounds * alive
        self.drafted += rounds * alive * self.K
        self.accepted += got - rounds * alive
        st = self.by_batch.setdefault(n, [0, 0, 0, 0.0])  # rounds, live rows' rounds, their tokens, GPU seconds
        st[0] += rounds
        st[1] += rounds * alive
        st[2] += got
        st[3] += flight.events[0].elapsed_time(flight.events[1]) / 1e3 if flight.events else 0.0
        out = RoundsOutput([], [])
        for b in range(n):
            out.counts.append(cnt[:, b].tolist())
            out.tokens.append([int(t) for m in range(rounds) for t in toks[m, b, :cnt[m, b]]])
        return out

    def pending_feats(self, b: int, c: int) -> torch.Tensor:
        """Row b's target features the draft has not fed [c, hidden], after the last run queued."""
        return self.P[b, :c].clone()

    def accepted_hidden(self, flight: Flight, counts: list[list[int]]) -> torch.Tensor:
        """The target's hidden rows of every round's new tokens' positions, sequence by sequence in order
        [sum(counts), hidden] (what kv.features keeps beside the KV, for prefix-cache hits)."""
        m, b, i = [], [], []
        for s, per in enumerate(counts):
            for r, k in enumerate(per):
                m.extend([flight.slot * self.M + r] * k)
                b.extend([s] * k)
                i.extend(range(k))
        idx = torch.tensor([m, b, i], dtype=torch.long, pin_memory=self._pin).to(self.device, non_blocking=True)
        return self.hist[idx[0], idx[1], idx[2]]


def _padded(rows, n: int, width: int, dtype) -> np.ndarray:
    """[n, width]: the ragged rows (block tables, token lists, a mask) left-aligned, zeros after them."""
    out = np.zeros((n, width), dtype=dtype)
    for b, row in enumerate(rows):
        out[b, :len(row)] = row
    return out
