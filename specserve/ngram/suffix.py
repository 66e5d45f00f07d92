"""Suffix matching over token sequences for suffix drafting (SuffixDecoding, Oliaro et al. 2024): find
the longest suffix of a context (up to `max_depth` tokens) that occurs in the indexed sequences, and
count what followed its occurrences, as a token tree whose node probabilities are those counts.

SuffixDecoding keeps a suffix tree per active prompt and one over earlier responses. This index gets
the same answers from less: every sequence's bigrams point at the positions after them (one list
entry per token), and a query walks the latest `max_candidates` occurrences of the context's last
bigram backwards to their match length; the occurrences of the longest match are what the suffix
tree's deepest matching node would hold. Pure Python and torch-free (a few hundred microseconds a
query); checked against brute force in tests/unit/test_suffix.py.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Hashable


@dataclass
class SuffixTree:
    """A draft tree: tokens in topological order, parents (-1: a child of the context's last token),
    and each node's probability given its parent (its share of the parent's continuations)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    support: list[int] = field(default_factory=list)  # occurrences the probability was counted over
    match_len: int = 0

    def __len__(self) -> int:
        return len(self.tokens)


class SuffixIndex:
    def __init__(self, max_depth: int = 32, max_candidates: int = 64):
        self.max_depth, self.max_candidates = max_depth, max_candidates
        self.seqs: dict[Hashable, list[int]] = {}
        self._index: dict[tuple[int, int], list[tuple[Hashable, int]]] = {}  # bigram -> [(seq, position after it)]
        self._dead = 0  # index entries of removed sequences, not yet compacted

    def __contains__(self, sid: Hashable) -> bool:
        return sid in self.seqs

    def extend(self, sid: Hashable, tokens: list[int]) -> None:
        """Append tokens to sequence sid (a new one if unknown)."""
        seq = self.seqs.setdefault(sid, [])
        start = len(seq)
        seq.extend(tokens)
        for i in range(max(start, 1), len(seq)):
            self._index.setdefault((seq[i - 1], seq[i]), []).append((sid, i + 1))

    def remove(self, sid: Hashable) -> None:
        seq = self.seqs.pop(sid, None)
        if seq is None:
            return
        self._dead += max(len(seq) - 1, 0)
        if self._dead > 4 * sum(max(len(s) - 1, 0) for s in self.seqs.values()) + 1024:
            self._compact()

    def _compact(self) -> None:
        self._index = {k: kept for k, v in self._index.items() if (kept := [e for e in v if e[0] in self.seqs])}
        self._dead = 0

    def match(self, context: list[int]) -> tuple[int, list[tuple[Hashable, int]]]:
        """(the longest match length >= 2, [(seq, position after the match)] of its latest occurrences
        that have a continuation); (0, []) when the context's last bigram never occurred."""
        if len(context) < 2:
            return 0, []
        entries = self._index.get((context[-2], context[-1]))
        if not entries:
            return 0, []
        best, found, seen = 0, [], 0
        limit = min(self.max_depth, len(context))
        for sid, end in reversed(entries):
            seq = self.seqs.get(sid)
            if seq is None or end >= len(seq):  # removed, or nothing followed (the context's own tail)
                continue
            seen += 1
            n = 2
            while n < limit and end - 1 - n >= 0 and seq[end - 1 - n] == context[-1 - n]:
                n += 1
            if n > best:
                best, found = n, [(sid, end)]
            elif n == best:
                found.append((sid, end))
            if seen >= self.max_candidates:
                break
        return best, found

    def draft(self, context: list[int], max_tokens: int, max_spec_factor: float = 1.0, min_prob: float = 0.1,
              max_depth: int = 32) -> SuffixTree:
        """The draft tree after context: the continuations of the longest match's occurrences, counted
        into a trie, then the nodes of highest path probability taken greedily (each at least min_prob
        given its parent) up to min(max_tokens, max_spec_factor x match length) nodes."""
        match_len, found = self.match(context)
        budget = min(max_tokens, int(max_spec_factor * match_len))
        tree = SuffixTree(match_len=match_len)
        if budget <= 0 or not found:
            return tree
        depth = min(max_depth, budget)
        # path -> {next token: occurrences that continued along path + next}
        children: dict[tuple[int, ...], dict[int, int]] = {}
        for sid, end in found:
            path: tuple[int, ...] = ()
            for t in self.seqs[sid][end:end + depth]:
                kids = children.setdefault(path, {})
                kids[t] = kids.get(t, 0) + 1
                path = path + (t,)
        # best-first over path probability; a child's never exceeds its parent's, so parents come first
        heap = [(-c / len(found), (t,), c / len(found), len(found)) for t, c in children[()].items()
                if c / len(found) >= min_prob]
        heapq.heapify(heap)
        node_of: dict[tuple[int, ...], int] = {}
        while heap and len(tree) < budget:
            neg, path, prob, n = heapq.heappop(heap)
            node_of[path] = len(tree)
            tree.tokens.append(path[-1])
            tree.parents.append(node_of.get(path[:-1], -1))
            tree.probs.append(prob)
            tree.support.append(n)
            kids = children.get(path, {})
            n = sum(kids.values())
            for t, c in kids.items():
                if c / n >= min_prob:
                    heapq.heappush(heap, (neg * c / n, path + (t,), c / n, n))
        return tree
