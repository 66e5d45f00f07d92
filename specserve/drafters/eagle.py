"""EAGLE drafting (Li et al. 2024): the draft network (models/eagle.py) reads the target's last hidden
states, which the engine passes to `observe` after every target step.

Alignment: draft row t takes (f_t, token at t + 1) and predicts f_{t+1}, whose logits give the token at
t + 2. After a target step a request with N tokens has target features for positions < N - 1, so the
draft first catches up on the features it has not consumed (ragged across the batch: the whole prompt
after prefill, 1 + accepted rows after a verify step), which yields the first draft token; each further
draft token is one single-row step fed with the draft's own predicted feature.

Token trees (EAGLE-2): the first level is the root's top_k tokens; each further level feeds the beam
nodes of highest cumulative confidence of the level before (each with its parent's predicted
feature, at its depth's position) in one pass for the whole batch, and takes the top_k children of
each. The fed nodes' draft KV rows sit after the context in the order they were fed; each attends to
the context and its own ancestors only (a tree longer than its queries: AttentionMetadata.span_parents).
The tree is then cut to the max_nodes nodes of highest cumulative confidence (drafters/tree.rerank).
"""
from __future__ import annotations

from typing import Optional

import torch

from ..models.eagle import EagleNet, EagleServing
from ..types import Draft, Request
from .base import Drafter, DrafterContext, Proposal, TreeShape
from .common import DraftKV, DraftPicker, autoregressive_drafts
from .tree import FedLevel, Growth, grow


class EagleDrafter(Drafter):
    wants_hidden_states = True
    makes_trees = True
    # cuda.eagle_graph.EagleChainGraphs, attached by the engine on CUDA: greedy chains drafted as graphs
    chain_graphs = None

    def __init__(self, net: EagleNet, target, num_blocks: int, block_size: int, attention: str = "split",
                 prefix_features=None, kv_dtype: Optional[torch.dtype] = None):
        """target: the serving model as models.TargetView (its embeddings, final norm, LM head rows and
        RoPE are shared); prefix_features, kv_dtype: DrafterContext's (the features of a prefix-cache
        hit; the cache type asked for, None: float32)."""
        cfg = net.cfg
        dev = target.device
        self.target = target
        self.vocab_ids = torch.tensor(cfg.vocab_ids, dtype=torch.long, device=dev)
        self.net = EagleServing(net, dev, use_blocks=target.blocked_head)
        self.head = target.head_rows(self.vocab_ids)  # [B, hidden] -> [B, V_draft] float32
        self.kv = DraftKV(1, num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim, kv_dtype or torch.float32, dev)
        self.picker = DraftPicker(target.arch.vocab_size, dev, self.vocab_ids)
        self.pending: dict[str, list[torch.Tensor]] = {}  # target features not yet fed to the draft
        self.num_pending: dict[str, int] = {}  # their rows (kept as a count: observe runs every step)
        self.attention = attention
        self.prefix_features = prefix_features

    @classmethod
    def load(cls, path: str, ctx: DrafterContext) -> "EagleDrafter":
        net = EagleNet.load(path)
        cfg, arch = net.cfg, ctx.target.arch
        if cfg.target_vocab_size != arch.vocab_size or \
                (cfg.tokenizer_sha256 and cfg.tokenizer_sha256 != ctx.tokenizer.fingerprint()):
            raise ValueError(f"{path}: this draft was trained for another tokenizer/vocabulary "
                             f"({cfg.target_vocab_size} tokens) than the target's ({arch.vocab_size} tokens)")
        if cfg.hidden_size != arch.hidden_size:
            raise ValueError(f"{path}: draft hidden size {cfg.hidden_size} does not match the target's {arch.hidden_size}")
        return cls(net, ctx.target, ctx.num_blocks, ctx.block_size, ctx.attention, ctx.prefix_features, ctx.kv_dtype)

    # --- target side ----------------------------------------------------------------------------
    def observe(self, request: Request, start: int, hidden: Optional[torch.Tensor], num_accepted: int) -> None:
        rid = request.request_id
        if hidden is None:
            return
        expected = self.kv.num_done.get(rid, 0) + self.num_pending.get(rid, 0)
        if start != expected:  # recomputed (preemption), started from a prefix-cache hit, or out of step
            self.release(request)
            if start != 0:  # from position 0 with the features the cache kept of the skipped positions
                past = None if self.prefix_features is None else self.prefix_features(request.block_table, start)
                if past is None:
                    return
                hidden = torch.cat([past, hidden.float()])
        self.pending.setdefault(rid, []).append(hidden.float())
        self.num_pending[rid] = self.num_pending.get(rid, 0) + len(hidden)

    def release(self, request: Request) -> None:
        self.kv.release(request.request_id)
        self.pending.pop(request.request_id, None)
        self.num_pending.pop(request.request_id, None)
        self.picker.release(request.request_id)

    def fork(self, parent: Request, child: Request) -> None:
        if self.kv.num_done.get(parent.request_id, 0) == 0 and parent.request_id in self.pending:
            self.pending[child.request_id] = list(self.pending[parent.request_id])
            self.num_pending[child.request_id] = self.num_pending[parent.request_id]

    # --- drafting -------------------------------------------------------------------------------
    def _ready(self, r: Request) -> bool:
        rid = r.request_id
        have = self.kv.num_done.get(rid, 0) + self.num_pending.get(rid, 0)
        return have == r.num_tokens - 1 and rid in self.pending

    @torch.inference_mode()
    def propose(self, requests: list[Request], max_len: int, min_confidence: Optional[float] = None,
                tree: Optional[TreeShape] = None) -> Proposal:
        drafts = {r.request_id: Draft() for r in requests}
        rows = max_len if tree is None else 1 + tree.beam * (max_len - 1)  # speculative draft rows, at most
        live = [r for r in requests if max_len > 0 and self._ready(r)
                and self.kv.reserve(r.request_id, r.num_tokens - 1 + rows)]
        if not live:
            return Proposal([drafts[r.request_id] for r in requests])
        f_hat, q_lens = self._catch_up(live)  # [B, hidden]: predicted feature at position N - 1
        if tree is not None:
            drafts.update(self._tree_drafts(live, f_hat, max_len, min_confidence, tree))
            # one pass per level (the catch-up made the first), over about beam rows per request: the
            # draft-step cost table is by rows, so a tree's passes are timed as passes of that many rows
            passes = max(max(d.depths(), default=0) for d in drafts.values())
            return Proposal([drafts[r.request_id] for r in requests], passes,
                            len(live) * min(tree.beam, tree.top_k), sum(q_lens))
        if self.chain_graphs is not None and all(r.params.greedy for r in live) and self.chain_graphs.fits(live, max_len):
            tokens, conf = self.chain_graphs.draft(live, f_hat, max_len)
            for r, toks, cs in zip(live, tokens, conf):
                keep, cum = len(toks), 1.0  # autoregressive_drafts' stop: after the token that falls below
                for j, c in enumerate(cs):
                    cum *= c
                    if min_confidence is not None and cum < min_confidence:
                        keep = j + 1
                        break
                drafts[r.request_id] = Draft(toks[:keep], None, cs[:keep])
            return Proposal([drafts[r.request_id] for r in requests], max(len(drafts[r.request_id].tokens) for r in live),
                            len(live), sum(q_lens))
        state = {"f_hat": f_hat}

        def advance(rows, tokens, reqs, j):
            # One speculative row per request: (its predicted feature, the token just drafted).
            f = state["f_hat"]
            if len(rows) < len(f):  # some requests stopped drafting
                f = f.index_select(0, torch.tensor(rows, device=f.device))
            pos = [r.num_tokens - 1 + j for r in reqs]
            state["f_hat"] = self._forward(reqs, f, tokens, pos, [1] * len(reqs), [p + 1 for p in pos])
            return self._logits(state["f_hat"])

        drafts.update(autoregressive_drafts(live, max_len, min_confidence, self.picker, self._logits(f_hat), advance))
        return Proposal([drafts[r.request_id] for r in requests], max(len(drafts[r.request_id].tokens) for r in live),
                        len(live), sum(q_lens))

    @torch.inference_mode()
    def feed_all_but(self, requests: list[Request], keep: int) -> bool:
        """Feed each request's unconsumed target features but its last `keep` (which a later pass feeds:
        the CUDA rounds' catch-up takes at most 1 + K), as the catch-up would; False, feeding nothing,
        where the draft cache has no room."""
        reqs = [r for r in requests if self.num_pending.get(r.request_id, 0) > keep]
        if not reqs:
            return True
        if not all(self.kv.reserve(r.request_id, r.num_tokens - 1) for r in reqs):
            return False
        self._feed(reqs, keep)
        return True

    def _catch_up(self, live: list[Request]) -> tuple[torch.Tensor, list[int]]:
        """Feed every unconsumed target feature, with the token that follows it -> (the predicted
        feature at each request's last position [B, hidden], the rows fed per request)."""
        pred, q_lens = self._feed(live, 0)
        last = torch.cumsum(torch.tensor(q_lens, device=pred.device), 0) - 1  # each request's last row
        return pred.index_select(0, last), q_lens

    def _feed(self, reqs: list[Request], keep: int) -> tuple[torch.Tensor, list[int]]:
        """Feed each request's unconsumed target features but its last `keep`, each with the token that
        follows it -> (the predicted features of the rows fed [rows, hidden], the rows fed per request)."""
        feats, toks, q_lens, kv_lens, positions = [], [], [], [], []
        for r in reqs:
            rid, done = r.request_id, self.kv.num_done[r.request_id]
            f = torch.cat(self.pending.pop(rid))  # [m + keep, hidden], positions done .. N - 2
            m = len(f) - keep
            feats.append(f[:m])
            toks.extend(r.token_at(t + 1) for t in range(done, done + m))
            positions.extend(range(done, done + m))
            q_lens.append(m)
            kv_lens.append(done + m)
            if keep:
                self.pending[rid], self.num_pending[rid] = [f[m:]], keep
            else:
                self.num_pending.pop(rid)
            self.kv.num_done[rid] = done + m  # real rows only; speculative rows are not counted
        return self._forward(reqs, torch.cat(feats), toks, positions, q_lens, kv_lens), q_lens

    def _tree_drafts(self, live: list[Request], f_hat: torch.Tensor, depth: int, min_confidence: Optional[float],
                     shape: TreeShape) -> dict[str, Draft]:
        """EAGLE-2 trees for the batch, one draft pass per level (see the module docstring)."""
        fed_feat: list[list[torch.Tensor]] = [[] for _ in live]  # per fed row: the feature it predicted

        def run_level(g: Growth, level: FedLevel) -> torch.Tensor:
            # each fed node: (its parent's predicted feature, its token) at its depth's position
            feats, toks, pos, q_lens, kv_lens, spans = [], [], [], [], [], []
            for b, nodes in zip(level.requests, level.nodes):
                r, t, rows = live[b], g.trees[b], g.fed_parent[b]
                for j in nodes:
                    p = rows[g.row_of[b][j]]
                    feats.append(f_hat[b] if p < 0 else fed_feat[b][p])
                    toks.append(t.tokens[j])
                    pos.append(r.num_tokens - 2 + g.depth[b][j])  # node at depth d: draft row N - 2 + d
                q_lens.append(len(nodes))
                kv_lens.append(self.kv.num_done[r.request_id] + len(rows))
                spans.append(list(rows))
            f = self._forward([live[b] for b in level.requests], torch.stack(feats), toks, pos, q_lens, kv_lens,
                              spans)  # [R, hidden]
            rows_f = iter(f)
            for b, nodes in zip(level.requests, level.nodes):
                fed_feat[b].extend(next(rows_f) for _ in nodes)
            return self._logits(f)

        g = grow(self._logits(f_hat), depth, shape.top_k, shape.beam, min_confidence, self.picker.vocab_list, run_level)
        return {r.request_id: d for r, d in zip(live, g.drafts(shape.max_nodes))}

    def _forward(self, reqs, feats, tokens, positions, q_lens, kv_lens, span_parents=None) -> torch.Tensor:
        dev = feats.device
        g = self.chain_graphs
        if g is not None:  # on CUDA: the fused kernels over static buffers where the pass fits them
            tables, trees = [self.kv.tables[r.request_id] for r in reqs], span_parents or [None] * len(reqs)
            if g.rows_fit(q_lens, kv_lens, tables, trees):
                return g.forward_rows(feats.float().contiguous(), tokens, positions, q_lens, kv_lens, tables, trees)
        ids = torch.tensor(tokens, dtype=torch.long, device=dev)
        embeds = self.target.embed_rows(ids).float()
        meta = self.kv.metadata([r.request_id for r in reqs], q_lens, kv_lens, self.attention, span_parents)
        return self.net.forward(embeds, feats, torch.tensor(positions, dtype=torch.long, device=dev),
                                self.target.rotary, meta, self.kv.cache.k[0], self.kv.cache.v[0])

    def _logits(self, f: torch.Tensor) -> torch.Tensor:  # [B, hidden] -> [B, V_draft]
        return self.head(self.target.final_norm(f.contiguous()))
