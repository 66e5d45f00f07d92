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
A token tree (beam W > 1: EAGLE-2's expansion with a fixed beam, so every shape is static): level 1 is
the draft's best W first tokens, level j + 1 the W best (by the draft's log-probability of the path) of
the top_k children of each level-j node, fed as W draft rows a level that see their ancestors (tree
masks in the draft's attention). The verify takes the last token and the W K nodes level by level, node
i of level j at position L + j in KV row L + 1 + (j - 1) W + i (past L: span_start L + 1, the nodes'
ancestor masks); acceptance walks down from the root, at each level taking the child whose token is
the target's argmax at its parent, and the accepted nodes' K/V move from their tree rows to their
positions' rows in every layer, so the next round finds the KV as a chain leaves it.
With K = 0 (no drafter) a round is one regular decode step. A row's argmax is the token regular
decoding picks at that position after the same context: exactly in float32; in bfloat16 up to the
rounding of a product of 1 + K (a tree: 1 + W K) rows per sequence against regular decoding's one,
unless the projections are batch-invariant (cuda/linear.py, ModelConfig.batch_invariant).
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
                 beam: int = 1, top_k: int = 1, capture: Optional[bool] = None):
        """runner: an engine.graph_runner.GraphModelRunner (its model, KV, static inputs and forward);
        chain_graphs: a cuda.eagle_graph.EagleChainGraphs (the EAGLE drafter's graph-safe pass), None
        for regular decoding; draft_len: K; max_rounds: M at most per run; beam: W, a token tree's
        nodes a level (1: a chain), each level the best W of the last level's nodes' top_k children."""
        self.runner, self.g = runner, chain_graphs
        self.K = K = draft_len if chain_graphs is not None else 0
        self.W = W = beam if K else 1
        self.top_k = top_k
        inp = runner.inputs
        self.Rv = Rv = 1 + W * K  # verify rows a sequence: the last token, then the tree's W K nodes
        if W < 1 or top_k < 1 or (W > 1 and W * K > inp.max_span) or Rv > runner.out[0].shape[0]:
            raise ValueError(f"a tree of {K} levels (draft_len) of {W} nodes (tree_beam) in CUDA rounds takes {W * K} "
                             f"tree rows and {Rv} verify rows a sequence, past the buffers' {inp.max_span} and "
                             f"{runner.out[0].shape[0]}: draft a smaller tree, or run without rounds (--cuda-rounds 0)")
        R = K + 1
        self.R, self.M = R, max_rounds
        self.scratch = (W - 1) * K  # KV rows a round's tree takes past its R
        self.device = dev = runner.device
        self.sizes = capture_sizes(max(1, min(max_seqs, inp.max_seqs, runner.out[0].shape[0] // Rv)))
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
        seqs = torch.arange(B, dtype=torch.int32, device=dev)
        self.rows_seq = seqs.repeat_interleave(R)  # [B R]: each catch-up row's sequence
        self.rows_verify = seqs.repeat_interleave(Rv)  # [B Rv]: each verify row's sequence
        self.rows_node = seqs.repeat_interleave(W)  # [B W]: each draft row's sequence
        # a verify row's position and KV row past L: the last token at L, then the tree's nodes level by
        # level, node i of level j (1..K) at position L + j in KV row L + 1 + (j - 1) W + i
        self.vpos = torch.cat([torch.zeros(1, **long), torch.arange(1, K + 1, **long).repeat_interleave(W)])  # [Rv]
        self.vrow = torch.arange(Rv, **long)  # [Rv]
        if W > 1:
            WK = W * K
            # each node's ancestors and itself over the tree's rows ([level, sequence, node, W K]: a level's
            # rows contiguous, the attention's tree mask of that level's draft pass), and each level's own bits
            self.mask = torch.zeros(K, B, W, WK, dtype=torch.int32, device=dev)
            self.own = torch.eye(WK, dtype=torch.int32, device=dev).view(K, W, WK)
            self.span_d = torch.full((B,), NO_TREE, dtype=torch.int32, device=dev)
            self.arK = torch.arange(K, **long)
            self.moved = torch.zeros(1, **long)  # accepted nodes whose K/V moved to their positions
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

    def _draft_inputs(self, limit: torch.Tensor, rows: int, seq: torch.Tensor, tree: Optional[torch.Tensor] = None):
        if tree is not None:  # a tree level's rows: each sees its ancestors' rows past L - 1
            return types.SimpleNamespace(seq=seq, limit=limit.int(), tables=self.d_tables, span_start=self.span_d,
                                         tree=tree, block_size=self.bs, max_span=tree.shape[1])
        return types.SimpleNamespace(seq=seq, limit=limit.int(), tables=self.d_tables, span_start=self.span[:rows],
                                     tree=self.tree, block_size=self.bs, max_span=1)

    def _ids(self, idx: torch.Tensor) -> torch.Tensor:
        """Draft vocabulary ids -> target ids."""
        v = self.g.drafter.vocab_ids
        return idx if v is None else v[idx]

    def _catch_up(self, n: int) -> torch.Tensor:
        """The draft's pass over each sequence's c new target features -> f_hat [n, hidden]: the draft's
        feature at position L, from which it predicts the token at L + 1."""
        R, L, c, live = self.R, self.L[:n], self.c[:n], self.live[:n]
        pos = ((L - c)[:, None] + self.ar).clamp(min=0)  # [n, R] (padding rows: L = 0 < c)
        ok = (self.ar[None, :] < c[:, None]) & live[:, None]
        slots = self._slots(self.d_tables[:n], pos, ok)
        inp = self._draft_inputs(pos.masked_fill(~ok, -1).reshape(-1), n * R, self.rows_seq[:n * R])
        f = self.g.eagle_pass(self.Ptok[:n].reshape(-1), self.P[:n].reshape(n * R, -1), pos.reshape(-1).int(),
                              slots.reshape(-1).int(), inp)  # [n R, hidden]
        return f.view(n, R, -1)[torch.arange(n, device=f.device), c - 1]

    def _draft(self, n: int) -> torch.Tensor:
        """The catch-up and a greedy chain of K draft tokens for n sequences -> [n, K] target ids."""
        g, K, L, live = self.g, self.K, self.L[:n], self.live[:n]
        f_hat = self._catch_up(n)
        tok = self._ids(g.drafter._logits(f_hat).argmax(-1))
        out = [tok]
        for j in range(1, K):
            p = (L + j - 1)[:, None]  # [n, 1]: the draft row's position (feature at p, token at p + 1)
            s = self._slots(self.d_tables[:n], p, live[:, None])[:, 0]
            inp = self._draft_inputs(p[:, 0].masked_fill(~live, -1), n, self.rows_node[:n])
            f_hat = g.eagle_pass(tok, f_hat, p[:, 0].int(), s.int(), inp)
            tok = self._ids(g.drafter._logits(f_hat).argmax(-1))
            out.append(tok)
        return torch.stack(out, 1)

    def _draft_tree(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The catch-up and a token tree of K levels of W nodes (EAGLE-2's expansion with a fixed beam):
        level 1 is the draft's best W first tokens; level j + 1 the W best, by the draft's log-probability
        of the path, of the top_k children of each level-j node -> (tokens [n, K, W] target ids, parents
        [n, K, W]: each node's parent's index in the level before, -1 on level 1). Node i of level j is
        fed at position L + j - 1, in draft KV row L + (j - 1) W + i, seeing its ancestors' rows."""
        g, K, W, kc, L, live = self.g, self.K, self.W, self.top_k, self.L[:n], self.live[:n]
        d, WK = g.drafter, W * K
        f = self._catch_up(n)
        score, idx = torch.log_softmax(d._logits(f).float(), -1).topk(W, -1)  # [n, W]
        f = f.repeat_interleave(W, 0)  # [n W, hidden]: the parent's feature of each level-1 node
        toks, parents = [self._ids(idx)], [torch.full((n, W), -1, dtype=torch.long, device=f.device)]
        self.span_d[:n].copy_(L)
        self.mask[0, :n].copy_(self.own[0])
        for j in range(1, K):
            p = (L + j - 1)[:, None]  # [n, 1]
            row = p + (j - 1) * (W - 1) + torch.arange(W, device=p.device)  # [n, W]: L + (j - 1) W + i
            s = self._slots(self.d_tables[:n], row, live[:, None]).reshape(-1)
            inp = self._draft_inputs(row.masked_fill(~live[:, None], -1).reshape(-1), n * W, self.rows_node[:n * W],
                                     self.mask[j - 1, :n].view(n * W, WK))
            f = g.eagle_pass(toks[-1].reshape(-1), f, p.expand(n, W).reshape(-1).int(), s.int(), inp)  # [n W, hidden]
            lp, idx = torch.log_softmax(d._logits(f).float(), -1).topk(kc, -1)  # [n W, kc]
            score, sel = (score[:, :, None] + lp.view(n, W, kc)).view(n, W * kc).topk(W, -1)  # [n, W]
            parent = sel // kc
            toks.append(self._ids(idx.view(n, W * kc).gather(1, sel)))
            parents.append(parent)
            self.mask[j, :n].copy_(self.mask[j - 1, :n].gather(1, parent[:, :, None].expand(n, W, WK)) | self.own[j])
            f = f.view(n, W, -1).gather(1, parent[:, :, None].expand(n, W, f.shape[-1])).reshape(n * W, -1)
        return torch.stack(toks, 1), torch.stack(parents, 1)

    def _accept_tree(self, n: int, toks: torch.Tensor, parents: torch.Tensor, a: torch.Tensor, h: torch.Tensor):
        """Greedy acceptance down the tree (accept_tree) -> (accepted count [n], the new tokens [n, R]
        (a_0, then the target's argmax at each accepted node), their hidden rows [n, R, hidden], the
        accepted node a level [n, K])."""
        K, W = self.K, self.W
        acc, path = accept_tree(toks, parents, a)
        at = a[:, 1:].view(n, K, W)  # the target's token after each node
        tok = torch.cat([a[:, :1], at.gather(2, path[:, :, None])[:, :, 0]], 1)  # [n, R]
        hn = h[:, 1:].view(n, K, W, -1)
        hp = torch.cat([h[:, :1], hn.gather(2, path[:, :, None, None].expand(n, K, 1, hn.shape[-1]))[:, :, 0]], 1)
        return acc, tok, hp, path

    def _move_kv(self, n: int, acc: torch.Tensor, path: torch.Tensor) -> None:
        """Copy the target's K/V of the accepted nodes from their tree rows (L + 1 + j W + path_j, level
        j from 0) to their positions' rows (L + 1 + j), in every layer. Rows with nothing to move copy a
        slot onto itself, and dead rows repeat a live row's pairs: no slot is written twice with
        different values."""
        K, W, L, live = self.K, self.W, self.L[:n], self.live[:n]
        tab = self.runner.inputs.tables[:n]
        dst_row = L[:, None] + 1 + self.arK  # [n, K]
        every = torch.ones_like(dst_row, dtype=torch.bool)
        dst = self._slots(tab, dst_row, every)
        src = self._slots(tab, dst_row + self.arK * (W - 1) + path, every)
        move = (self.arK[None, :] < acc[:, None]) & live[:, None]
        src = torch.where(move, src, dst)
        first = live.long().argmax().view(1)  # a live row (a run has one)
        dst = torch.where(live[:, None], dst, dst.index_select(0, first)).reshape(-1)
        src = torch.where(live[:, None], src, src.index_select(0, first)).reshape(-1)
        st = self.runner.static
        for cache in (st.k_cache, st.v_cache):  # [layers, slots, Hkv, D]
            cache.index_copy_(1, dst, cache.index_select(1, src))
        self.moved.add_((move & (src != dst).view(n, K)).sum())

    def _round(self, n: int) -> None:
        K, W, Rv = self.K, self.W, self.Rv
        run, inp = self.runner, self.runner.inputs
        L, live = self.L[:n], self.live[:n]
        if K == 0:
            ids = self.last[:n, None]  # [n, 1]
        elif W == 1:
            d = self._draft(n)  # [n, K]
            ids = torch.cat([self.last[:n, None], d], 1)
        else:
            toks, parents = self._draft_tree(n)  # [n, K, W] each
            ids = torch.cat([self.last[:n, None], toks.reshape(n, K * W)], 1)
        pos = L[:, None] + self.vpos  # [n, Rv]
        row = L[:, None] + self.vrow  # KV rows (a chain: the positions)
        T = n * Rv
        inp.ids[:T].copy_(ids.reshape(-1))
        inp.positions[:T].copy_(pos.reshape(-1))
        inp.slots[:T].copy_(self._slots(inp.tables[:n], row, live[:, None]).reshape(-1))
        inp.seq[:T].copy_(self.rows_verify[:T])
        inp.limit[:T].copy_(row.masked_fill(~live[:, None], -1).reshape(-1))
        if W > 1:  # the tree's rows start past the last token's; the last token's row reads no mask
            inp.span_start[:n].copy_(L + 1)
            inp.tree[:T].view(n, Rv, -1)[:, 1:, :K * W].copy_(self.mask[:, :n].transpose(0, 1).reshape(n, K * W, K * W))
        logits, hidden = run.static(T, out=run.out)
        a = logits.argmax(-1).view(n, Rv)
        h = hidden.view(n, Rv, -1).float()
        if K == 0:
            acc, tok, hp = torch.zeros(n, dtype=torch.long, device=a.device), a, h
        elif W == 1:
            acc, tok, hp = torch.cumprod((d == a[:, :K]).long(), 1).sum(1), a, h  # leading matches
        else:
            acc, tok, hp, path = self._accept_tree(n, toks, parents, a, h)
            self._move_kv(n, acc, path)
        self.out_tok[:, :n].index_copy_(0, self.counter, tok[None])
        self.out_n[:, :n].index_copy_(0, self.counter, (acc + 1)[None])
        self.hist[:, :n].index_copy_(0, self.counter, hp[None])
        self.P[:n].copy_(hp)
        self.Ptok[:n].copy_(tok)
        self.c[:n].copy_(acc + 1)
        self.last[:n].copy_(tok.gather(1, acc[:, None])[:, 0])
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


def accept_tree(toks: torch.Tensor, parents: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy acceptance of token trees, every level's nodes at once (a few kernels a level: in a CUDA
    graph each costs a launch slot):

        want[j, i]  = a_0 for level 0, else the target's token after node i's parent, a[1 + (j-1) W + parent]
        alive[j, i] = (toks[j, i] == want[j, i]) and (j == 0 or alive[j-1, parent[j, i]])
        accepted    = the number of levels with a live node;  path[j] = the live node of level j

    A live node is one whose whole path from the root is the target's own greedy tokens. Siblings carry
    different tokens and only one parent a level can be live, so a level has at most one live node.

    toks, parents: [n, K, W] (parents[:, 0] unused); a: [n, 1 + K W] the target's argmax after the last
    token, then after each node level by level -> (accepted [n], path [n, K]: 0 past the accepted levels)."""
    n, K, W = toks.shape
    at = a[:, 1:].view(n, K, W)
    want = torch.cat([a[:, :1, None].expand(n, 1, W), at[:, :-1].gather(2, parents[:, 1:])], 1)  # [n, K, W]
    match = toks == want
    alive = [match[:, 0]]
    for j in range(1, K):
        alive.append(match[:, j] & alive[-1].gather(1, parents[:, j]))
    live = torch.stack(alive, 1)  # [n, K, W]
    return live.any(2).sum(1), live.long().argmax(2)


def _padded(rows, n: int, width: int, dtype) -> np.ndarray:
    """[n, width]: the ragged rows (block tables, token lists, a mask) left-aligned, zeros after them."""
    out = np.zeros((n, width), dtype=dtype)
    for b, row in enumerate(rows):
        out[b, :len(row)] = row
    return out
