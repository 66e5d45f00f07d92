"""A separate, smaller language model as the draft (Leviathan et al.; Chen et al.): any model that
shares the target's tokenizer. It keeps its own paged KV cache; after verification the rows of the
accepted drafts stay (they were computed on exactly those tokens) and the rest is rolled back; it
also drafts token trees (the class docstring)."""
from __future__ import annotations

import json
import os
import time
from typing import Optional

import torch

from ..loading import EMBEDDED_FILE
from ..types import Draft, Request
from .base import Drafter, DrafterContext, Proposal, TreeShape
from .common import DraftKV, DraftPicker, autoregressive_drafts
from .tree import FedLevel, Growth, grow

SHIPPED_DRAFTS = {EMBEDDED_FILE: "smollm2-135m-instruct-eagle"}  # target file name -> draft under specserve/weights


def ships_for(target_path: str) -> bool:
    """Whether a draft ships for this target file (default_draft_path finds one)."""
    return os.path.basename(target_path) in SHIPPED_DRAFTS


def default_draft_path(target_path: str) -> str:
    name = SHIPPED_DRAFTS.get(os.path.basename(target_path))
    if name is None:
        raise ValueError(f"no draft ships for {os.path.basename(target_path)}; pass speculative={{'draft_model': PATH}} "
                         "(an EAGLE draft from `specserve train-draft`, or any model with the same tokenizer)")
    return os.path.join(os.path.dirname(os.path.dirname(__file__)), "weights", name)


def build(spec, ctx: DrafterContext) -> Drafter:
    """The "draft" method: an EAGLE draft directory (config.json with vocab_ids), else any model file
    or directory that shares the target's tokenizer."""
    path = spec.draft_model or default_draft_path(ctx.target_path)
    if _is_eagle(path):
        if spec.draft_quant != "none":
            raise ValueError(f"draft_quant={spec.draft_quant!r} re-encodes a standalone GGUF draft model's blocks; "
                             f"{path} is an EAGLE draft (dense weights): leave draft_quant at 'none'")
        from .eagle import EagleDrafter
        return EagleDrafter.load(path, ctx)
    return load_model_drafter(path, ctx, spec.draft_vocab, spec.draft_quant)


def load_model_drafter(path: str, ctx: DrafterContext, vocab: int = 0, quant: str = "none") -> "DraftModelDrafter":
    """A standalone draft model (any model file or directory with the target's tokenizer). The target's
    own file is not loaded again: the stage runs the loaded target over a KV cache of its own (loading
    it twice doubled the weights' memory). vocab: its head over that many of the most
    frequent tokens (drafters/vocab.py; 0 or the whole vocabulary's size: all of it). quant: the GGML
    type its wider weights are re-encoded as ("none": as stored; config.DRAFT_QUANTS)."""
    from ..loading import load_model_files, resolve_model_path
    from ..models import build_model
    target = ctx.target
    path = resolve_model_path(path)  # a known model's name: its pulled file
    vocab_ids = None
    if 0 < vocab < target.arch.vocab_size:
        from .vocab import frequent_vocab
        vocab_ids = frequent_vocab(ctx.tokenizer, vocab).to(target.device)
    if os.path.realpath(path) == os.path.realpath(ctx.target_path):
        return DraftModelDrafter(target, ctx.num_blocks, ctx.block_size, ctx.attention, vocab_ids, ctx.kv_dtype)
    _, arch, weights, draft_tok = load_model_files(path, keep_quantized=True)
    if quant != "none":
        from ..loading.weights import requantize_weights
        weights = requantize_weights(weights, quant.upper())
    if draft_tok.fingerprint() != ctx.tokenizer.fingerprint() or arch.vocab_size != target.arch.vocab_size:
        raise ValueError(f"{path}: the draft's tokenizer/vocabulary ({arch.vocab_size} tokens) differs from the "
                         f"target's ({target.arch.vocab_size} tokens); a draft must share the target's tokenizer")
    model = build_model(arch, weights, target.dtype, target.device, use_blocks=getattr(target, "use_blocks", True),
                        max_len=target.max_len, activations=target.activations)
    return DraftModelDrafter(model, ctx.num_blocks, ctx.block_size, ctx.attention, vocab_ids, ctx.kv_dtype)


def _is_eagle(path: str) -> bool:
    cfg = os.path.join(path, "config.json")
    if not (os.path.isdir(path) and os.path.exists(cfg) and os.path.exists(os.path.join(path, "model.safetensors"))):
        return False
    with open(cfg) as f:
        return "vocab_ids" in json.load(f)


class DraftModelDrafter(Drafter):
    """Also what a stage of staged drafting (drafters/staged.py) runs through its public methods:
    reserve, catch_up, score, mark_drafted, truncate, generator.

    Token trees (EAGLE-2, drafters/tree.grow): the catch-up's last row gives the root's top_k children;
    each further level feeds the beam best nodes of the level before at their depth's position, their
    KV rows after the context in the order fed, each attending to the context and its own ancestors
    (AttentionMetadata.span_parents). No tree row is kept after verification: the accepted path's
    tokens are fed again by the next catch-up (1 + accepted rows in one pass)."""

    makes_trees = True

    def __init__(self, model, num_blocks: int, block_size: int, attention: str = "split",
                 vocab_ids: Optional[torch.Tensor] = None, kv_dtype: Optional[torch.dtype] = None):
        self.model = model
        a = model.arch
        self.kv = DraftKV(a.num_hidden_layers, num_blocks, block_size, a.num_key_value_heads, a.head_dim,
                          kv_dtype or model.dtype, model.device)
        # a reduced vocabulary (drafters/vocab.py): the head's rows [V'], and the picker maps them back
        self.vocab_ids = vocab_ids
        self.head_rows = None if vocab_ids is None else model.head_rows(vocab_ids)
        self.picker = DraftPicker(a.vocab_size, model.device, vocab_ids)
        self.proposed_at: dict[str, tuple[int, int]] = {}  # rid -> (tokens when drafted, speculative rows)
        self.attention = attention
        self.passes = 0  # model passes run (catch-ups included): memory traffic in `specserve bench staged`
        # cuda.draft_graph.DraftModelGraphs, attached by the engine on CUDA: the passes that fit replay a graph
        self.graphs = None

    @torch.inference_mode()
    def propose(self, requests: list[Request], max_len: int, min_confidence: Optional[float] = None,
                tree: Optional[TreeShape] = None) -> Proposal:
        drafts = {r.request_id: Draft() for r in requests}
        fed = max_len - 1 if tree is None else tree.beam * (max_len - 1)  # draft rows past the known tokens
        live = [r for r in requests if max_len > 0 and self.reserve(r, r.num_tokens + fed)]
        if not live:
            return Proposal([drafts[r.request_id] for r in requests])
        t0 = time.perf_counter()
        logits, catchup = self.catch_up(live)
        catchup_seconds = time.perf_counter() - t0
        if tree is not None:
            g = grow(logits, max_len, tree.top_k, tree.beam, min_confidence, self.picker.vocab_list,
                     lambda g, level: self._tree_level(live, g, level))
            drafts.update((r.request_id, d) for r, d in zip(live, g.drafts(tree.max_nodes)))
            for r in live:
                self.mark_drafted(r, 0)
            passes = max(max(drafts[r.request_id].depths(), default=0) for r in live)
            self.passes += passes
            # the draft-step cost table is by rows: a tree's passes are timed as passes of about beam rows
            return Proposal([drafts[r.request_id] for r in requests], passes, len(live) * min(tree.beam, tree.top_k),
                            catchup, catchup_seconds)

        def advance(rows, tokens, reqs, j):
            return self.score(reqs, [[t] for t in tokens], [r.num_tokens + j for r in reqs])

        drafts.update(autoregressive_drafts(live, max_len, min_confidence, self.picker, logits, advance))
        for r in live:
            self.mark_drafted(r, len(drafts[r.request_id].tokens) - 1)
        self.passes += max(len(drafts[r.request_id].tokens) for r in live)
        return Proposal([drafts[r.request_id] for r in requests], max(len(drafts[r.request_id].tokens) for r in live),
                        len(live), catchup, catchup_seconds)

    def _tree_level(self, live: list[Request], g: Growth, level: FedLevel) -> torch.Tensor:
        """One tree level's fed nodes, each at its depth's position (depth d: position N - 1 + d) ->
        the logits after each [R, V']."""
        ids, pos, q_lens, kv_lens, spans = [], [], [], [], []
        for b, nodes in zip(level.requests, level.nodes):
            r, rows = live[b], g.fed_parent[b]
            ids += [g.trees[b].tokens[j] for j in nodes]
            pos += [r.num_tokens - 1 + g.depth[b][j] for j in nodes]
            q_lens.append(len(nodes))
            kv_lens.append(self.kv.num_done[r.request_id] + len(rows))
            spans.append(list(rows))
        return self._forward([live[b] for b in level.requests], ids, pos, q_lens, kv_lens, every_row=True,
                             span_parents=spans)

    # --- what a drafting stage uses (staged.py) ----------------------------------------------------
    def reserve(self, request: Request, num_tokens: int) -> bool:
        """Room in the draft's KV for positions < num_tokens; False when it is full (no draft then)."""
        return self.kv.reserve(request.request_id, num_tokens)

    def catch_up(self, requests: list[Request], full_vocab: bool = False) -> tuple[torch.Tensor, int]:
        """Run every token of each request the draft has not seen yet (the whole prompt the first time),
        now seen -> (logits after each request's last token [B, V'] (full_vocab: [B, vocab]), the rows run)."""
        spans = [(r, self.kv.num_done[r.request_id], r.num_tokens) for r in requests]
        logits = self.score(requests, [[r.token_at(t) for t in range(a, b)] for r, a, b in spans],
                            [a for _, a, _ in spans], full_vocab=full_vocab)
        for r in requests:
            self.kv.num_done[r.request_id] = r.num_tokens
        return logits, sum(b - a for _, a, b in spans)

    def catchup_rows(self, request: Request) -> int:
        return request.num_tokens - self.kv.num_done.get(request.request_id, 0)

    @torch.inference_mode()
    def prefill(self, chunks: list[tuple[Request, int]]) -> int:
        """Every prompt position up to each chunk's end the draft has not seen, in one pass without logits
        (the first drafting step's catch-up then feeds only the tokens decoded since)."""
        todo = [(r, self.kv.num_done.get(r.request_id, 0), end) for r, end in chunks]
        todo = [(r, a, b) for r, a, b in todo if a < b and self.reserve(r, b)]
        if not todo:
            return 0
        reqs = [r for r, _, _ in todo]
        q_lens = [b - a for _, a, b in todo]
        self._forward(reqs, [r.token_at(t) for r, a, b in todo for t in range(a, b)],
                      [p for _, a, b in todo for p in range(a, b)], q_lens, [b for _, _, b in todo], no_logits=True)
        for r, _, b in todo:
            self.kv.num_done[r.request_id] = b
        self.passes += 1
        return sum(q_lens)

    def mark_drafted(self, request: Request, rows: int) -> None:
        """The first `rows` tokens of request's draft (after its known tokens) have KV rows computed on
        them: after verification `observe` keeps those of the accepted ones."""
        self.proposed_at[request.request_id] = (request.num_tokens, rows)

    def truncate(self, request: Request, valid: int) -> None:
        """Only the first `valid` positions of request's KV stay (rows past them were computed on
        tokens that were rejected); no draft of it awaits verification."""
        rid = request.request_id
        self.proposed_at.pop(rid, None)
        if rid in self.kv.num_done:
            self.kv.num_done[rid] = min(self.kv.num_done[rid], valid)

    def generator(self, request: Request) -> torch.Generator:
        """request's draft generator (seeded from its seed)."""
        return self.picker.generator(request)

    @property
    def weight_bytes(self) -> int:
        return self.model.weight_bytes

    def score(self, reqs: list[Request], spans: list[list[int]], starts: list[int], every_row: bool = False,
              full_vocab: bool = False) -> torch.Tensor:
        """Run each request's token span at its positions -> logits of each span's last row [B, V']
        (every_row: of every row [sum of span lengths, V'], spans one after another). V' is the reduced
        vocabulary where there is one (the picker's ids); full_vocab: over the target's ids, -inf
        outside the reduced set (what a staged level compares its helper's proposals in)."""
        q_lens = [len(s) for s in spans]
        logits = self._forward(reqs, [t for s in spans for t in s],
                               [p for a, n in zip(starts, q_lens) for p in range(a, a + n)], q_lens,
                               [a + n for a, n in zip(starts, q_lens)], every_row=every_row)
        if full_vocab and self.vocab_ids is not None:
            full = logits.new_full((logits.shape[0], self.model.arch.vocab_size), float("-inf"))
            logits = full.index_copy_(1, self.vocab_ids, logits)
        return logits

    def _forward(self, reqs: list[Request], ids: list[int], positions: list[int], q_lens: list[int],
                 kv_lens: list[int], every_row: bool = False, span_parents=None, no_logits: bool = False) -> torch.Tensor:
        """The draft over each request's q_lens rows (tokens ids at positions, attending to kv_lens KV rows;
        span_parents: a tree's) -> logits of each request's last row [B, V'] (every_row: of every row;
        no_logits: of none, [0, V'], the rows' KV alone)."""
        dev = self.model.device
        if no_logits:
            last = torch.zeros(0, dtype=torch.long, device=dev)
        elif every_row:
            last = torch.arange(len(ids), device=dev)
        else:
            last = torch.cumsum(torch.tensor(q_lens, device=dev), 0) - 1
        rids = [r.request_id for r in reqs]
        if self.graphs is not None:
            logits = self.graphs.forward([self.kv.tables[r] for r in rids], ids, positions, q_lens, kv_lens,
                                         span_parents, last)
            if logits is not None:
                return logits
        meta = self.kv.metadata(rids, q_lens, kv_lens, self.attention, span_parents)
        ids_t = torch.tensor(ids, dtype=torch.long, device=dev)
        return self.model.forward(ids_t, torch.tensor(positions, dtype=torch.long, device=dev), meta,
                                  self.kv.cache.k, self.kv.cache.v, last, head_rows=self.head_rows)

    def report(self) -> dict:
        return {"models": [{"stage": "draft", "passes": self.passes, "weight_bytes": self.model.weight_bytes}]}

    def reset_report(self) -> None:
        self.passes = 0

    def observe(self, request: Request, start: int, hidden: Optional[torch.Tensor], num_accepted: int) -> None:
        rid = request.request_id
        at = self.proposed_at.pop(rid, None)
        if start == 0 and self.kv.num_done.get(rid, 0):  # recomputed after preemption
            self.release(request)
        elif at is not None:  # keep the accepted drafts' rows, which were computed on the same tokens
            self.kv.num_done[rid] = at[0] + min(num_accepted, at[1])

    def release(self, request: Request) -> None:
        self.kv.release(request.request_id)
        self.picker.release(request.request_id)
        self.proposed_at.pop(request.request_id, None)
