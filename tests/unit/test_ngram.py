"""The Katz back-off trigram model (ngram/katz.py) against brute force, and the n-gram drafter's
bookkeeping. Torch-free, milliseconds."""
import numpy as np
import pytest

from specserve.drafters.ngram import NgramDrafter, _band
from specserve.ngram import KatzModel, good_turing_discounts
from specserve.types import Draft, Request, SamplingParams, TokenOrigin


def _model(V=30, N=1500, seed=0, **kw):
    rng = np.random.default_rng(seed)
    # a skewed corpus (Zipf-like), so that some contexts are rich and many are sparse
    ids = np.minimum(rng.zipf(1.5, N) - 1, V - 1)
    return KatzModel.build(ids, V, **kw), ids


@pytest.mark.parametrize("V, N, seed", [(30, 1500, 0), (20, 300, 1), (50, 20000, 2), (200, 5000, 3)])
def test_distributions_sum_to_one_and_top_is_the_brute_force_ranking(V, N, seed):
    m, ids = _model(V, N, seed)
    rng = np.random.default_rng(seed + 10)
    contexts = [[], [int(ids[0])], ids[5:7].tolist()] + [rng.integers(0, V, rng.integers(1, 3)).tolist() for _ in range(30)]
    for ctx in contexts:
        p = np.array([m.prob(ctx, t) for t in range(V)])
        assert abs(p.sum() - 1) < 1e-5, ctx
        top = m.top(ctx, 4)
        assert np.allclose([q for _, q in top], np.sort(p)[::-1][:4], rtol=1e-6), ctx
        assert all(abs(p[t] - q) < 1e-7 for t, q in top)


def test_seen_trigram_probability_is_the_discounted_count():
    ids = np.array([0, 1, 2, 0, 1, 2, 0, 1, 3, 0, 1, 2])  # (0, 1) -> 2 three times, -> 3 once
    m = KatzModel.build(ids, 5)
    trigrams = ids[:-2] * 25 + ids[1:-1] * 5 + ids[2:]
    d = good_turing_discounts(np.bincount(np.unique(trigrams, return_counts=True)[1], minlength=7))
    i = m.trigram.find(0 * 5 + 1)
    for t, n in {2: 3, 3: 1}.items():
        assert m.trigram.prob_of(i, t) == pytest.approx(d[n] * n / 4, rel=1e-6)


def test_good_turing_discounts_match_katz_formula():
    n = np.array([0, 100, 40, 20, 12, 8, 6, 5])  # n_r for r = 0..7
    d = good_turing_discounts(n, k=5)
    common = 6 * n[6] / n[1]
    for r in range(1, 6):
        expected = ((r + 1) * n[r + 1] / (r * n[r]) - common) / (1 - common)
        assert d[r] == pytest.approx(expected)
    assert all(0 < x < 1 for x in d[1:])


def test_ngrams_do_not_cross_the_separator():
    ids = np.array([5, 6, 9, 7, 8, 9, 5, 6, 9])  # 9 ends each document
    m = KatzModel.build(ids, 10, separator=9)
    assert m.bigram.find(9) == -1  # nothing follows a separator
    assert m.trigram.find(6 * 10 + 9) == -1


def test_save_and_load_round_trip(tmp_path):
    m, _ = _model()
    m.meta["tokenizer_sha256"] = "abc"
    m.save(tmp_path / "m.npz")
    m2 = KatzModel.load(str(tmp_path / "m.npz"))
    assert m2.meta == m.meta
    for ctx in ([], [1], [2, 3], [0, 0]):
        assert m2.top(ctx, 3) == m.top(ctx, 3)


def test_bad_corpus_fails_with_one_line():
    with pytest.raises(ValueError, match="at least 3 tokens"):
        KatzModel.build(np.array([1, 2]), 5)
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 5\)"):
        KatzModel.build(np.array([1, 2, 7]), 5)


def _request(ids, rid="r"):
    return Request(rid, list(ids), SamplingParams(temperature=0, max_tokens=8))


def test_drafter_drafts_the_models_greedy_chain_and_counts_what_was_accepted():
    m, ids = _model(V=30, N=3000)
    d = NgramDrafter(m)
    r = _request(ids[:10].tolist())
    draft = d.propose([r], 4).drafts[0]
    ctx, want = ids[:10].tolist(), []
    for _ in range(4):
        t = m.top(ctx, 1)[0][0]
        want.append(t)
        ctx.append(t)
    assert draft.tokens == want and draft.probs is None and len(draft.confidence) == 4
    bands = [_band(m.top(ids[:10].tolist() + want[:j], 1)[0][1]) for j in range(4)]
    expected = [list(c) for c in d.counts]
    for j in range(2):  # first accepted, second rejected, the rest never tried
        c = expected[bands[j]]
        c[0], c[1] = 0.998 * c[0] + (j < 1), 0.998 * c[1] + 1
    d.on_verified(r, draft, 1)
    d.observe(r, 10, None, 1)
    assert np.allclose(d.counts, expected)
    # a draft that was not verified (cut by the selection: no on_verified) is not counted
    d.propose([r], 4)
    d.observe(r, 11, None, 0)
    assert np.allclose(d.counts, expected)
    # nor is another drafter's draft verified for the same request
    d.on_verified(r, Draft([1, 2], origin=TokenOrigin.LOOKUP), 2)
    assert np.allclose(d.counts, expected)


def test_building_the_model_reports_on_stderr_not_stdout(tmp_path, capsys):
    """`specserve generate --speculative ngram` builds the model on first use: its status line must not
    land in the generated text on stdout."""
    from specserve.training.ngram import build_ngram

    class Tok:
        vocab_size, eos_token_ids = 16, [0]

        def fingerprint(self):
            return "t"

    path = tmp_path / "ids.npy"
    np.save(path, np.array([1, 2, 3, 1, 2, 4, 0, 5, 6], dtype=np.int64))
    build_ngram(Tok(), corpus_tokens=-1, token_files=(str(path),))
    out, err = capsys.readouterr()
    assert out == "" and "n-gram model: 9 tokens" in err
