"""Suffix drafting's index (ngram/suffix.py) against brute force, and the drafter's bookkeeping:
longest matches and their occurrences, draft trees counted from what followed, earlier outputs
shared across requests."""
import random

import pytest

from specserve.drafters.suffix import SuffixDrafter
from specserve.ngram.suffix import SuffixIndex
from specserve.types import Draft, FinishReason, Request, RequestStatus, SamplingParams, TokenOrigin


def _brute_match(seqs, context, max_depth):
    best, found = 0, set()
    for sid, seq in seqs.items():
        for end in range(2, len(seq)):  # a continuation must follow
            n = 0
            while n < min(max_depth, len(context)) and end - 1 - n >= 0 and seq[end - 1 - n] == context[-1 - n]:
                n += 1
            if n >= 2 and n > best:
                best, found = n, {(sid, end)}
            elif n >= 2 and n == best:
                found.add((sid, end))
    return best, found


@pytest.mark.parametrize("seed", range(6))
def test_match_is_the_longest_suffix_and_all_its_occurrences(seed):
    rng = random.Random(seed)
    idx = SuffixIndex(max_depth=8, max_candidates=10_000)
    seqs = {}
    for sid in range(4):
        seqs[sid] = [rng.randrange(4) for _ in range(rng.randrange(5, 60))]
        idx.extend(sid, seqs[sid][:7])
        idx.extend(sid, seqs[sid][7:])  # appended in two goes: bigrams across the seam count
    for _ in range(40):
        context = [rng.randrange(4) for _ in range(rng.randrange(1, 12))]
        best, found = idx.match(context)
        assert (best, set(found)) == _brute_match(seqs, context, 8)


def test_draft_tree_counts_continuations_and_is_cut_by_match_length_and_branch_share():
    idx = SuffixIndex()
    idx.extend("a", [1, 2, 3, 4, 5, 9, 1, 2, 3, 4, 6, 9, 1, 2, 3, 4, 5, 7, 1, 2, 3, 4, 5, 9, 0])
    t = idx.draft([8, 2, 3, 4], max_tokens=10, min_prob=0.1)
    # the longest match is "2 3 4" (3 tokens), found 4 times: followed by 5 (3 times) and 6 (once);
    # 5 by 9 (twice) and 7 (once). Best first by path probability: 5 (3/4), 5-9 (1/2), then 6 or 5-7 (1/4
    # each; the tie goes to the smaller path, 5-7)
    assert t.match_len == 3 and len(t) == 3  # budget: 1.0 x match length
    assert t.tokens == [5, 9, 7] and t.parents == [-1, 0, 0]
    assert t.probs == pytest.approx([3 / 4, 2 / 3, 1 / 3]) and t.support == [4, 3, 3]
    wide = idx.draft([0, 1, 2, 3, 4], max_tokens=4, min_prob=0.1)  # a 4-token match: a budget of 4
    assert len(wide) == 4 and wide.tokens[:3] == [5, 9, 7] and wide.match_len == 4
    strict = idx.draft([0, 1, 2, 3, 4], max_tokens=4, min_prob=0.3)
    assert 6 not in strict.tokens  # a branch taken by under 30% of the occurrences is dropped
    assert len(idx.draft([8, 8], max_tokens=10)) == 0  # never seen: no draft


def test_removed_sequences_stop_matching_and_the_index_compacts():
    idx = SuffixIndex()
    idx.extend("x", [1, 2, 3] * 10)
    idx.extend("y", [5, 6, 7])
    assert idx.match([1, 2])[0] >= 2
    idx.remove("x")
    assert idx.match([1, 2]) == (0, [])
    for i in range(1000):  # removed entries are dropped in compactions, which keep the live sequence
        idx.extend(i, [9, 9, 9, 9])
        idx.remove(i)
    assert idx.match([5, 6]) == (2, [("y", 2)])
    assert sum(len(v) for v in idx._index.values()) < 1100  # 3,000 entries were added


def _request(rid, prompt, out=()):
    r = Request(rid, list(prompt), SamplingParams(temperature=0))
    r.output_token_ids = list(out)
    return r


def test_finished_outputs_are_drafted_for_later_requests():
    d = SuffixDrafter(max_nodes=15)
    first = _request("a", [1, 2, 3], [10, 11, 12, 13, 14, 15, 16, 17])
    assert d.propose([first], 8).drafts[0].tokens == []  # nothing to match yet
    first.status, first.finish_reason = RequestStatus.FINISHED, FinishReason.STOP
    d.release(first)
    later = _request("b", [7, 7, 10, 11, 12, 13])
    draft = d.propose([later], 8).drafts[0]
    assert draft.tokens == [14, 15, 16, 17] and draft.origin == TokenOrigin.SUFFIX and not draft.is_tree
    assert draft.confidence == pytest.approx([2 / 3] * 4)  # one occurrence: (1 + 1) / (1 + 2)
    assert d.propose([later], 2).drafts[0].tokens == [14, 15]  # the depth the policy asks for
    assert d.propose([later], 8, min_confidence=0.5).drafts[0].tokens == [14]  # cumulative 2/3, then 4/9
    preempted = _request("c", [4, 5, 6], [1])
    d.propose([preempted], 4)
    d.release(preempted)  # not finished: its output is not cached
    assert ("live", "c") not in d.index and len(d.cached) == 1


def test_shares_are_scaled_by_what_verification_measured_of_them():
    """A single earlier occurrence drafts its first token at 2/3; when such drafts keep being rejected
    (chat), the confidences shrink towards what was measured, and only verified suffix drafts count
    (another drafter's draft chosen by auto, or a draft the selection cut, change nothing)."""
    d = SuffixDrafter(max_nodes=15)
    first = _request("a", [1, 2, 3], [10, 11, 12, 13, 14, 15, 16, 17])
    first.status, first.finish_reason = RequestStatus.FINISHED, FinishReason.STOP
    d.propose([first], 8)
    d.release(first)
    later = _request("b", [7, 7, 10, 11, 12, 13])

    def verified(origin, drafted, accepted):
        draft = d.propose([later], 8).drafts[0]
        d.on_verified(later, Draft(draft.tokens[:drafted], origin=origin), accepted)
        d.observe(later, 0, None, accepted)

    for _ in range(10):
        verified(TokenOrigin.LOOKUP, 4, 0)  # not ours
    d.propose([later], 8)
    d.observe(later, 0, None, 0)  # ours, but cut by the selection: no verify step
    assert d.scale == 1.0
    for _ in range(30):
        verified(TokenOrigin.SUFFIX, 4, 0)  # ours, rejected at the first token
    conf = d.propose([later], 8).drafts[0].confidence
    assert d.scale == pytest.approx(10 / (10 + 2 / 3 * sum(0.995 ** i for i in range(30))))
    assert conf[0] == pytest.approx(2 / 3 * d.scale) and conf[0] < 0.25
    for _ in range(200):
        verified(TokenOrigin.SUFFIX, 4, 4)  # now always accepted: confidences recover (capped at 0.99)
    assert 2 / 3 < 0.85 < d.propose([later], 8).drafts[0].confidence[0] <= 0.99  # above the raw share
