"""A Katz back-off trigram model over token ids (Katz 1987), stored as numpy arrays.

Staged speculative decoding (Spector & Re 2023) drafts its draft model's tokens with one: a model that
costs a few microseconds a token, right often enough on the predictable stretches (indentation, closing
brackets, common identifiers) to pay for the rows it adds. Probabilities:

    P(w | u, v) = d(c(u,v,w)) * c(u,v,w) / c(u,v)     if the trigram was seen
                = alpha(u, v) * P(w | v)               else (back off to the bigram)
    P(w | v)    = d(c(v,w)) * c(v,w) / c(v)           if the bigram was seen
                = alpha(v) * P(w)                      else
    P(w)        = (c(w) + 1) / (N + V)                 (add-one, so no token has probability 0)

with Good-Turing discounts d(r) for counts r <= K (Katz's form: r* = (r+1) n_{r+1} / n_r, rescaled so
counts above K keep d = 1), and alpha the mass the discounts set aside, spread over the unseen
continuations in proportion to the lower order. Each order is a CSR table: sorted context keys, their
alpha, and their continuations sorted by probability, so the most likely continuation of a context is
its first entry and a lookup is one binary search. Torch-free.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

import numpy as np

K_DISCOUNT = 5  # Katz's threshold: counts above it are trusted as they are
FORMAT_VERSION = 1


def good_turing_discounts(count_of_counts: np.ndarray, k: int = K_DISCOUNT) -> np.ndarray:
    """d[r] for r = 0..k (d[0] unused): Katz's discounted Good-Turing ratios. count_of_counts[r] = n_r
    (how many distinct n-grams were seen exactly r times), length >= k + 2. Where the counts of counts
    are too sparse for the formula (a ratio outside (0, 1]), that r falls back to absolute discounting
    with D = n_1 / (n_1 + 2 n_2), which always sets some mass aside."""
    n = np.asarray(count_of_counts, dtype=np.float64)
    d = np.ones(k + 1)
    n1, n2 = n[1], n[2] if len(n) > 2 else 0.0
    D = n1 / (n1 + 2 * n2) if n1 + 2 * n2 > 0 else 0.5
    common = (k + 1) * n[k + 1] / n1 if n1 > 0 else 0.0
    for r in range(1, k + 1):
        ratio = None
        if n[r] > 0 and common < 1:
            ratio = ((r + 1) * n[r + 1] / (r * n[r]) - common) / (1 - common)
        d[r] = ratio if ratio is not None and 0 < ratio < 1 else max(1e-3, (r - D) / r)
    return d


@dataclass
class _Order:
    """One order's table: contexts (sorted keys), their alpha, and [offsets[i], offsets[i+1]) their
    continuations (token, discounted probability) sorted by probability, highest first."""

    keys: np.ndarray  # [C] int64
    alpha: np.ndarray  # [C] float32: back-off weight of each context
    offsets: np.ndarray  # [C + 1] int64
    tokens: np.ndarray  # [E] int32
    probs: np.ndarray  # [E] float32

    def find(self, key: int) -> int:
        """The context's index, or -1 when it was never seen."""
        i = int(np.searchsorted(self.keys, key))
        return i if i < len(self.keys) and self.keys[i] == key else -1

    def prob_of(self, i: int, token: int) -> Optional[float]:
        lo, hi = self.offsets[i], self.offsets[i + 1]
        hit = np.nonzero(self.tokens[lo:hi] == token)[0]
        return float(self.probs[lo + hit[0]]) if len(hit) else None


class KatzModel:
    """Built with `KatzModel.build(token_ids, vocab_size)`, saved with `save(path)` (.npz), loaded with
    `KatzModel.load(path)`. `top(context, n)` gives the n most likely next tokens with their
    probabilities; `prob(context, token)` one token's."""

    def __init__(self, vocab_size: int, unigram: np.ndarray, bigram: _Order, trigram: _Order, meta: dict):
        self.vocab_size, self.unigram, self.bigram, self.trigram, self.meta = vocab_size, unigram, bigram, trigram, meta
        self._uni_order = np.argsort(-unigram, kind="stable")  # [V] tokens by unigram probability, for back-off

    # --- building -------------------------------------------------------------------------------------
    @classmethod
    def build(cls, ids: np.ndarray, vocab_size: int, separator: Optional[int] = None, k: int = K_DISCOUNT) -> "KatzModel":
        """ids: [N] token ids (documents joined; n-grams that span `separator`, e.g. EOS, are not counted
        past it: the separator ends a document and starts none)."""
        ids = np.asarray(ids, dtype=np.int64)
        V = int(vocab_size)
        if len(ids) < 3:
            raise ValueError(f"an n-gram model needs at least 3 tokens of corpus, got {len(ids)}")
        if ids.min() < 0 or ids.max() >= V:
            raise ValueError(f"token ids must lie in [0, {V}); got {ids.min()}..{ids.max()}")
        uni_counts = np.bincount(ids, minlength=V).astype(np.float64)
        unigram = ((uni_counts + 1) / (uni_counts.sum() + V)).astype(np.float32)  # [V]
        ok2 = np.ones(len(ids) - 1, dtype=bool) if separator is None else ids[:-1] != separator
        big_keys, big_counts = np.unique((ids[:-1] * V + ids[1:])[ok2], return_counts=True)
        bigram, big_probs = cls._order(big_keys, big_counts, V, lambda ctx, tok: unigram[tok].astype(np.float64), k)
        ok3 = np.ones(len(ids) - 2, dtype=bool) if separator is None else (ids[:-2] != separator) & (ids[1:-1] != separator)
        tri_keys, tri_counts = np.unique((ids[:-2] * V * V + ids[1:-1] * V + ids[2:])[ok3], return_counts=True)

        def lower(ctx: np.ndarray, tok: np.ndarray) -> np.ndarray:
            # P(w | v) for seen trigrams (u, v, w): (v, w) is always a seen bigram
            return big_probs[np.searchsorted(big_keys, (ctx % V) * V + tok)]

        trigram, _ = cls._order(tri_keys, tri_counts, V, lower, k)
        meta = {"format": FORMAT_VERSION, "tokens": int(len(ids)), "vocab_size": V, "k": k,
                "bigrams": int(len(big_keys)), "trigrams": int(len(tri_keys))}
        return cls(V, unigram, bigram, trigram, meta)

    @staticmethod
    def _order(keys: np.ndarray, counts: np.ndarray, V: int, lower, k: int) -> tuple[_Order, np.ndarray]:
        """keys: sorted unique (context * V + token); counts: how often each was seen; lower(ctx, tok):
        the lower order's probability of tok after ctx's shorter context, for the seen pairs.
        -> (the table, each key's probability in the keys' order)."""
        ctx, tok = keys // V, keys % V
        d = good_turing_discounts(np.bincount(counts, minlength=k + 2)[:k + 2], k)
        disc = np.where(counts <= k, d[np.minimum(counts, k)], 1.0)
        ctx_keys, starts = np.unique(ctx, return_index=True)
        offsets = np.append(starts, len(keys)).astype(np.int64)
        sizes = np.diff(offsets)  # [C] continuations per context
        ctx_totals = np.add.reduceat(counts, starts).astype(np.float64)  # c(context)
        which = np.repeat(np.arange(len(ctx_keys)), sizes)  # [E] each entry's context
        lower_mass = np.add.reduceat(lower(ctx, tok), starts)
        # a context followed by every token of the vocabulary has nothing to back off to: no discount
        complete = sizes == V  # [C]
        probs = np.where(complete[which], 1.0, disc) * counts / ctx_totals[which]  # [E]
        seen_mass = np.add.reduceat(probs, starts)
        alpha = np.where(complete, 0.0, (1.0 - seen_mass) / np.maximum(1.0 - lower_mass, 1e-12))
        # continuations by probability within each context (a stable sort on (context, -prob))
        order = np.lexsort((-probs, which))
        table = _Order(ctx_keys.astype(np.int64), alpha.astype(np.float32), offsets, tok[order].astype(np.int32),
                       probs[order].astype(np.float32))
        return table, probs

    # --- storage ---------------------------------------------------------------------------------------
    def save(self, path: str) -> None:
        arrays = {"unigram": self.unigram, "vocab_size": np.array(self.vocab_size),
                  "meta": np.array(json.dumps(self.meta))}
        for name, o in (("bigram", self.bigram), ("trigram", self.trigram)):
            for f in ("keys", "alpha", "offsets", "tokens", "probs"):
                arrays[f"{name}_{f}"] = getattr(o, f)
        np.savez(path, **arrays)

    @classmethod
    def load(cls, path: str) -> "KatzModel":
        with np.load(path) as z:
            orders = [_Order(*(z[f"{name}_{f}"] for f in ("keys", "alpha", "offsets", "tokens", "probs")))
                      for name in ("bigram", "trigram")]
            meta = json.loads(str(z["meta"]))
            if meta.get("format") != FORMAT_VERSION:
                raise ValueError(f"{path}: n-gram model format {meta.get('format')}, this version reads "
                                 f"{FORMAT_VERSION}; rebuild it with `specserve build-ngram`")
            return cls(int(z["vocab_size"]), z["unigram"], *orders, meta)

    # --- queries ---------------------------------------------------------------------------------------
    def _levels(self, context: list[int]) -> list[tuple[_Order, int]]:
        """The seen contexts among context's last two tokens and its last one: (table, index), longest first."""
        keys = []
        if len(context) >= 2:
            keys.append((self.trigram, context[-2] * self.vocab_size + context[-1]))
        if context:
            keys.append((self.bigram, context[-1]))
        return [(order, i) for order, i in ((o, o.find(k)) for o, k in keys) if i >= 0]

    def prob(self, context: list[int], token: int) -> float:
        """P(token | the last two tokens of context), backing off as needed."""
        scale = 1.0
        for order, i in self._levels(context):
            p = order.prob_of(i, token)
            if p is not None:
                return scale * p
            scale *= float(order.alpha[i])
        return scale * float(self.unigram[token])

    def top(self, context: list[int], n: int = 1) -> list[tuple[int, float]]:
        """The n most likely next tokens after context, (token, probability), highest first. Exact: the
        longest seen context's continuations, then the shorter contexts' best among the tokens the
        longer ones never saw, scaled by the back-off weights (under Katz such a token can outrank a
        seen one), stopping once nothing backed off can beat the n-th best so far."""
        out: dict[int, float] = {}
        scale, seen = 1.0, None  # seen: [V] bool, the tokens a matched longer context has a probability for
        for order, i in self._levels(context):
            lo, hi = order.offsets[i], order.offsets[i + 1]
            self._add(out, order.tokens[lo:hi], order.probs[lo:hi], scale, seen, n)
            scale *= float(order.alpha[i])
            if scale == 0 or (len(out) >= n and sorted(out.values(), reverse=True)[n - 1] >= scale):
                return sorted(out.items(), key=lambda x: -x[1])[:n]  # nothing backed off can beat these
            seen = np.zeros(self.vocab_size, dtype=bool) if seen is None else seen
            seen[order.tokens[lo:hi]] = True
        self._add(out, self._uni_order, self.unigram[self._uni_order], scale, seen, n)
        return sorted(out.items(), key=lambda x: -x[1])[:n]

    @staticmethod
    def _add(out: dict, tokens: np.ndarray, probs: np.ndarray, scale: float, seen: Optional[np.ndarray], n: int) -> None:
        """The first n of (tokens, probs) (sorted by probability) that no longer context saw, scaled."""
        if seen is not None:  # filter a growing head of the list, not all of it (the unigram's is [V])
            m = 4 * n + 16
            while True:
                keep = ~seen[tokens[:m]]
                if keep.sum() >= n or m >= len(tokens):
                    tokens, probs = tokens[:m][keep], probs[:m][keep]
                    break
                m *= 4
        for t, p in zip(tokens[:n].tolist(), probs[:n].tolist()):
            out[t] = scale * p

