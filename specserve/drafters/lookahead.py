"""Lookahead decoding (Fu et al. 2024, "Break the Sequential Dependency of LLM Inference Using
Lookahead Decoding"): no draft model; the target itself runs Jacobi iterations on a window of guessed
future tokens inside its verify pass, and the n-grams those iterations produce become drafts.

Per sequence the drafter keeps a 2-D window: N - 1 levels of W guessed tokens (level 0 the oldest
Jacobi iteration, level N - 2 the newest), and a pool of n-grams keyed by their first token. Each step
the verify span is one token tree rooted at the last known token (lookahead and verification branch
in one pass, as in the paper's attention mask, Figure 2 there):

  - the lookahead branch: level 0 as a chain from the root (its column 0 is the root itself), and
    below level 0's column i the column's newer levels, one under the other. Each window cell then
    attends to exactly what the paper's mask lets it see: the root, level 0 up to its column, and its
    own column's older levels. The target's greedy token after column i's newest cell is the next
    Jacobi iteration of that column;
  - the verification branch: up to G n-grams from the pool that start with the last known token,
    chains of N - 1 tokens below the root.

Both branches go into one trie (a cell and a guess with the same path are the same computation), and
verification is the engine's: the longest matching path for greedy requests, multi-candidate
speculative sampling for sampled ones (every node is a deterministic draft, q = one-hot), so the
output is exactly the target's whichever node gets accepted. After the pass (`observe_span`, the
target's greedy token after every row) the window shifts one level, its newest level becomes those
tokens, and each column's trajectory (the old level-0 token, then the column's levels) enters the
pool as an n-gram (FIFO, G per first token, no duplicates). Each extra accepted token shifts the
window once more (the newest level refilled from level 0), as the reference implementations do.

The window's rows are not drafts of the sequence (their chance of acceptance is low): they are what
lookahead pays each step for the pool. On a GPU those rows are nearly free and the paper's windows are
wide (W = 15, N = 5, G = 15 for 7B models); on a CPU each row costs a real share of a step
(bench/results: the step-time curve), so the engine's selection keeps the window only where its
measured worth (the acceptance of window and pool nodes, counted here) pays for its rows, and
`fallback=False` forces the whole window every step, as the paper runs it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..types import Draft, Request, TokenOrigin
from .base import Drafter, DrafterContext, Proposal

# Acceptance priors, conditional on the parent's acceptance: (pool guesses, window cells). A pool
# n-gram is a trajectory the target has produced nearby; a window cell a guess a few iterations old.
PRIOR = (0.3, 0.05)
PRIOR_WEIGHT = 20.0
DECAY = 0.995  # per verified node: the counts follow what is being served now


def build(spec, ctx: DrafterContext) -> Drafter:
    return LookaheadDrafter(spec.lookahead_window, spec.lookahead_ngram, spec.lookahead_guesses)


@dataclass
class _Window:
    levels: list[list[int]]  # [N - 1][W]: levels[0] oldest; levels[0][0] is the root's place (unused)
    pool: dict[int, list[tuple[int, ...]]] = field(default_factory=dict)  # first token -> n-grams (N - 1 tokens after it)
    # this step's tree, by node path (tokens from the root's child down): the window's cells, the
    # pool's guesses (a path may be both)
    cells: Optional[set] = None  # None: no window this step
    guesses: set = field(default_factory=set)
    last: int = -1  # the last known token when the tree was proposed


class LookaheadDrafter(Drafter):
    wants_span_argmax = True
    origin = TokenOrigin.LOOKAHEAD

    def __init__(self, window: int = 4, ngram: int = 3, guesses: int = 4):
        if window < 1 or ngram < 2 or guesses < 0:
            raise ValueError(f"lookahead needs window >= 1, ngram >= 2 and guesses >= 0 (got {window}, {ngram}, {guesses})")
        self.W, self.N, self.G = window, ngram, guesses
        self.windows: dict[str, _Window] = {}
        self.counts = [[PRIOR_WEIGHT * p, PRIOR_WEIGHT] for p in PRIOR]  # (pool, window): [accepted, tried]

    def confidence(self, kind: int) -> float:
        acc, tried = self.counts[kind]
        return acc / tried

    def _window(self, r: Request) -> _Window:
        w = self.windows.get(r.request_id)
        if w is None:
            # The paper starts from random tokens; the prompt's tokens, spread over it, are as good a
            # start and keep runs reproducible.
            ids = r.all_token_ids
            n = self.W * (self.N - 1)
            levels = [[ids[(len(ids) * (j * self.W + i)) // n] for i in range(self.W)] for j in range(self.N - 1)]
            w = self.windows[r.request_id] = _Window(levels)
        return w

    # --- the tree ----------------------------------------------------------------------------------
    def propose(self, requests: list[Request], max_len: int, min_confidence: Optional[float] = None,
                tree=None) -> Proposal:
        return Proposal([self._tree(r, max_len, window=True) for r in requests])

    def propose_free(self, requests: list[Request], max_len: int) -> Optional[Proposal]:
        """On plain steps: the pool's guesses alone (no window rows), verified where they pay."""
        return Proposal([self._tree(r, max_len, window=False) for r in requests])

    def _tree(self, r: Request, max_len: int, window: bool) -> Draft:
        w = self._window(r)
        w.last = r.token_at(r.num_tokens - 1)
        tokens: list[int] = []
        parents: list[int] = []
        paths: list[tuple[int, ...]] = []
        children: dict[tuple[int, int], int] = {}  # (parent, token) -> node: one trie for both branches

        def add(parent: int, token: int) -> int:
            node = children.get((parent, token))
            if node is None:
                node = children[(parent, token)] = len(tokens)
                tokens.append(token)
                parents.append(parent)
                paths.append((paths[parent] if parent >= 0 else ()) + (token,))
            return node

        # the verification branch: the pool's n-grams after the last known token (a policy's draft
        # length bounds these; the window's depth is set by W and N)
        for gram in w.pool.get(w.last, [])[:self.G]:
            p = -1
            for t in gram[:max_len]:
                p = add(p, t)
        w.guesses = set(paths)
        w.cells = None
        if window:
            cells = []
            spine = [-1]  # level 0: column 0 is the root
            for i in range(1, self.W):
                spine.append(add(spine[-1], w.levels[0][i]))
                cells.append(spine[-1])
            for i in range(self.W):
                p = spine[i]
                for j in range(1, self.N - 1):
                    p = add(p, w.levels[j][i])
                    cells.append(p)
            w.cells = {paths[j] for j in cells}
        if not tokens:
            return Draft(origin=TokenOrigin.LOOKAHEAD)
        # a node's chance of acceptance given its parent's: a guess's, or (only a window cell) a cell's
        conf = [self.confidence(0 if q in w.guesses else 1) for q in paths]
        chain = parents == list(range(-1, len(tokens) - 1))
        return Draft(tokens, None, conf, None if chain else parents, TokenOrigin.LOOKAHEAD)

    def _cell(self, w: _Window, i: int) -> tuple[int, ...]:
        """The path of column i's newest cell: level 0 up to column i, then the column's levels."""
        return tuple(w.levels[0][1:i + 1]) + tuple(w.levels[j][i] for j in range(1, self.N - 1))

    # --- after the pass ----------------------------------------------------------------------------
    def observe_span(self, request: Request, draft: Draft, argmax: list[int], path: list[int]) -> None:
        """The target's greedy token after every row of the verified span (argmax[0] after the root,
        argmax[j + 1] after draft token j) and the accepted path (draft indices): one Jacobi iteration
        of the window, its trajectories into the pool, and the acceptance counts."""
        w = self.windows.get(request.request_id)
        if w is None or draft.origin != TokenOrigin.LOOKAHEAD:
            return
        parents = draft.parent_list()
        paths = draft.paths()
        after = {(): argmax[0]} | {p: argmax[j + 1] for j, p in enumerate(paths)}
        # acceptance of the nodes the verifier tried (their parent accepted, or the root's children)
        accepted = set(path)
        tried = {-1} | accepted
        for j, p in enumerate(parents):
            if p in tried:
                kind = 0 if paths[j] in w.guesses else 1
                c = self.counts[kind]
                c[0] = DECAY * c[0] + (j in accepted)
                c[1] = DECAY * c[1] + 1.0
        if w.cells is None:
            return  # no window this step (a plain step's guesses only)
        newest = [after.get(self._cell(w, i)) for i in range(self.W)]  # None: cut by the selection
        if all(t is None for t in newest):
            return
        old0 = list(w.levels[0])
        w.levels = w.levels[1:] + [[t if t is not None else old0[i] for i, t in enumerate(newest)]]
        for i in range(self.W):
            if newest[i] is None:
                continue
            gram = tuple(w.levels[j][i] for j in range(self.N - 1))
            grams = w.pool.setdefault(old0[i], [])
            if gram not in grams:
                grams.append(gram)
                if len(grams) > self.G:
                    grams.pop(0)
        for _ in range(len(path)):  # the sequence moved on by more than one token
            if self.N > 2:
                w.levels = w.levels[1:] + [list(w.levels[1])]

    def release(self, request: Request) -> None:
        self.windows.pop(request.request_id, None)

    def fork(self, parent: Request, child: Request) -> None:
        w = self.windows.get(parent.request_id)
        if w is not None:
            self.windows[child.request_id] = _Window([list(lv) for lv in w.levels],
                                                     {k: list(v) for k, v in w.pool.items()})

    def report(self) -> dict:
        return {"lookahead": {"window": self.W, "ngram": self.N, "guesses": self.G,
                              "pool_acceptance": round(self.confidence(0), 3),
                              "window_acceptance": round(self.confidence(1), 3)}}
