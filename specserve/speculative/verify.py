"""Verification: each draft's verify span of logits rows -> the accepted drafts plus one token from the
target. A pure function of the drafts, their logits, the requests' params and generators (the
generators' draws are its only effect): what the step learns from the result is the controller's
`learn`, after the step (speculative/decoder.py).

  - seeded sampled requests draw the target's own tokens and follow their draft while it matches
    (sampling/seeded.py): their output is regular decoding's for the seed, whatever was drafted;
  - greedy chains: the longest prefix matching the target's argmax, then the target's token;
  - sampled chains: modified rejection sampling (Leviathan et al.), q = one-hot for deterministic drafts;
  - token trees: the longest matching path (greedy), multi-candidate speculative sampling (sampled).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from ..sampling.rejection import rejection_sample, verify_greedy
from ..sampling.sampler import warp_logits
from ..sampling.seeded import verify_by_sampling
from ..sampling.tree import children_table, verify_tree, verify_tree_greedy
from ..types import Draft, SamplingParams, TokenOrigin

MAX_TREE_DEPTH = 32  # the deepest draft any policy asks for (BASS's l_limit)
# the widest node a drafter makes (suffix drafting: 1 / MIN_PROB children; lookahead: its guesses and
# the window's spine below the root): with the tree's top_k, the sampled verifier's uniforms grid
MAX_TREE_WIDTH = 16


@dataclass(frozen=True)
class Verified:
    """One request's verify span, verified."""

    num_drafted: int
    num_accepted: int
    tokens: list[int]  # to emit: the accepted drafts, then one token from the target
    # the span rows that stay (row 0: the last known token; draft token j is row j + 1): the root and
    # the accepted path, whose logits rows gave `tokens`. A chain's are 0..num_accepted; a tree's path
    # may skip rows, whose KV then moves up (Scheduler.keep_rows).
    rows: tuple[int, ...] = ()
    depth: int = 0  # the draft's depth (a chain's length)
    origin: TokenOrigin = TokenOrigin.DRAFT  # who proposed the accepted drafts (the last token: the target)
    path: tuple[int, ...] = ()  # the accepted draft tokens' indices, root first
    # the target's greedy token after every span row (asked for: drafters that `wants_span_argmax`)
    argmax: Optional[list[int]] = None

    @property
    def origins(self) -> list[TokenOrigin]:
        """Who proposed each of `tokens`."""
        return [self.origin] * self.num_accepted + [TokenOrigin.TARGET]

    @property
    def num_rejected(self) -> int:
        return self.num_drafted - self.num_accepted


def is_seeded(params: SamplingParams, seed: Optional[int]) -> bool:
    """A seeded sampled request: its output does not depend on its drafts (sampling/seeded.py)."""
    return seed is not None and not params.greedy


def verify(drafts: Sequence[Draft], logits: Sequence[torch.Tensor], params: Sequence[SamplingParams],
           generators: Sequence, seeded: Sequence[bool], tree_width: int = 0,
           span_argmax: bool = False) -> list[Verified]:
    """drafts[i] verified on logits[i] [1 + k_i, vocab] (its span's rows, masked and biased as the request
    asks) with params[i] and generators[i]; seeded[i]: is_seeded. tree_width: the widest a drafter's tree
    node gets (with MAX_TREE_WIDTH: the sampled tree verifier's grid); span_argmax: also return the
    target's greedy token after every row."""
    n = len(drafts)
    paths: list[list[int]] = [[] for _ in range(n)]  # accepted draft tokens (indices)
    nxt: list[int] = [0] * n  # the target's token after the accepted ones
    for i in (i for i in range(n) if seeded[i]):
        paths[i], nxt[i] = verify_by_sampling(logits[i], drafts[i], params[i], generators[i])
    chains = [i for i, d in enumerate(drafts) if not d.is_tree and not seeded[i]]
    trees = [i for i, d in enumerate(drafts) if d.is_tree and not seeded[i]]
    greedy = [i for i in chains if params[i].greedy]
    sampled = [i for i in chains if not params[i].greedy]
    if greedy:
        for i, (a, t) in zip(greedy, verify_greedy([logits[i] for i in greedy], [drafts[i].tokens for i in greedy])):
            paths[i], nxt[i] = list(range(a)), t
    if sampled:
        for i, a, t in _rejection_sample([drafts[i] for i in sampled], [logits[i] for i in sampled],
                                         [params[i] for i in sampled], [generators[i] for i in sampled], sampled):
            paths[i], nxt[i] = list(range(a)), t
    if trees:
        for greedy_pass in (True, False):
            sel = [i for i in trees if params[i].greedy == greedy_pass]
            if sel:
                for i, path, t in _verify_trees([drafts[i] for i in sel], [logits[i] for i in sel],
                                                [params[i] for i in sel], [generators[i] for i in sel], sel,
                                                greedy_pass, tree_width):
                    paths[i], nxt[i] = path, t
    out = []
    for i, (d, path) in enumerate(zip(drafts, paths)):
        out.append(Verified(len(d.tokens), len(path), [d.tokens[j] for j in path] + [nxt[i]],
                            (0,) + tuple(j + 1 for j in path), max(d.depths(), default=0), d.origin, tuple(path),
                            logits[i].argmax(dim=-1).tolist() if span_argmax else None))
    return out


def _rejection_sample(drafts: list[Draft], logits: list[torch.Tensor], params: list[SamplingParams],
                      generators: list, index: list[int]):
    """Sampled chains in one padded batch. Yields (index[row], accepted, the target's next token)."""
    K = max(len(d.tokens) for d in drafts)
    V, dev = logits[0].shape[-1], logits[0].device
    num = torch.tensor([len(d.tokens) for d in drafts], device=dev)
    tokens = torch.zeros(len(drafts), K, dtype=torch.long, device=dev)
    for row, d in enumerate(drafts):
        tokens[row, :len(d.tokens)] = torch.tensor(d.tokens, device=dev)
    p = torch.zeros(len(drafts), K + 1, V, device=dev)
    # None: a deterministic draft, q = one-hot (all None: rejection_sample takes q = None)
    q = None if all(d.probs is None for d in drafts) else torch.zeros(len(drafts), K, V, device=dev)
    for row, d in enumerate(drafts):
        p[row, :len(logits[row])] = warp_logits(logits[row], params[row])
        if q is not None and d.probs is not None:
            q[row, :len(d.probs)] = d.probs
        elif q is not None:
            k = len(d.tokens)
            q[row, torch.arange(k, device=dev), tokens[row, :k]] = 1.0
    n_acc, nxt = rejection_sample(p, q, tokens, num, generators)
    for row, i in enumerate(index):
        yield i, int(n_acc[row]), int(nxt[row])


def _verify_trees(drafts: list[Draft], logits: list[torch.Tensor], params: list[SamplingParams], generators: list,
                  index: list[int], greedy: bool, tree_width: int):
    """Token-tree drafts (deterministic top-k children), all greedy or all sampled: the longest matching
    path for greedy requests, multi-candidate speculative sampling for sampled ones (sampling/tree.py).
    Yields (index[row], accepted path of draft indices, the target's next token)."""
    N = max(len(d.tokens) for d in drafts)
    V, dev = logits[0].shape[-1], logits[0].device
    tables = [children_table(d.parents) for d in drafts]
    W = max(t.shape[1] for t in tables)
    children = torch.full((len(drafts), N + 1, W), -1, dtype=torch.long)
    tokens = torch.zeros(len(drafts), N, dtype=torch.long)
    target = torch.zeros(len(drafts), N + 1, V, device=dev)
    for row, (d, t) in enumerate(zip(drafts, tables)):
        children[row, :t.shape[0], :t.shape[1]] = t
        tokens[row, :len(d.tokens)] = torch.tensor(d.tokens)
        target[row, :len(d.tokens) + 1] = logits[row] if greedy else warp_logits(logits[row], params[row])
    if greedy:
        paths, nxt = verify_tree_greedy(target, tokens.to(dev), children.to(dev))
    else:
        # the uniforms' grid is fixed per request (sampling/tree.py): the deepest draft a policy asks
        # for, the tree's width
        paths, nxt = verify_tree(target, None, tokens.to(dev), children.to(dev), generators,
                                 max_depth=MAX_TREE_DEPTH, max_width=max(tree_width, MAX_TREE_WIDTH))
    for row, i in enumerate(index):
        yield i, paths[row], int(nxt[row])
