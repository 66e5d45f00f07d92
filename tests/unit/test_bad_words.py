"""bad_words (sampling/bad_words.py): the word forms as vLLM makes them, and the banned cells of every
row of chains and trees against a plain per-row reference."""
import pytest
import torch

from specserve import SamplingParams
from specserve.sampling.bad_words import bad_word_forms, banned
from specserve.sampling.penalties import PenaltySpan, apply_penalties

# a toy tokenizer: whole words of this table, else one token per character
WORDS = {"cat": 1, " cat": 2, "dog": 3, " dog": 3, "bad": 4, "apple": 5, " apple": 6}


def encode(text):
    if text in WORDS:
        return [WORDS[text]]
    return [100 + ord(c) for c in text]


def test_forms_as_vllm_makes_them():
    """The word as written (leading space stripped) and, after a space, its form where that is as many
    tokens with another first token; each form once."""
    assert bad_word_forms(["cat"], encode) == ((1,), (2,))
    assert bad_word_forms(["  cat"], encode) == ((1,), (2,))  # stripped first
    assert bad_word_forms(["dog"], encode) == ((3,),)  # " dog" is the same token: one form
    assert bad_word_forms(["ab"], encode) == ((197, 198),)  # " ab" is 3 tokens: not a form of the same length
    assert bad_word_forms(["cat", "cat", "apple"], encode) == ((1,), (2,), (5,), (6,))


def reference(output, path, forms):
    """The tokens banned after output + path, form by form."""
    seq = list(output) + list(path)
    out = set()
    for f in forms:
        prefix = list(f[:-1])
        if len(prefix) <= len(seq) and seq[len(seq) - len(prefix):] == prefix:
            out.add(f[-1])
    return out


@pytest.mark.parametrize("parents", [None, [-1, 0, 1, 2], [-1, -1, 0, 1, 0]])  # no draft, a chain, a tree
@pytest.mark.parametrize("output", [[], [7], [5, 7, 8], [7, 8, 9, 7, 8]])
def test_each_row_bans_what_its_own_path_makes_next(parents, output):
    forms = ((9,), (7, 8), (7, 8, 9), (8, 7, 8, 2), (1, 1))
    draft = [] if parents is None else [7, 8, 9, 7, 8][:len(parents)]
    paths = []
    for t, par in zip(draft, parents or []):
        paths.append((paths[par] if par >= 0 else ()) + (t,))
    got = banned(output, paths, forms)
    for row, path in enumerate([()] + paths):
        assert {t for r, t in got if r == row} == reference(output, path, forms), (row, path)
    assert all(0 <= r <= len(paths) for r, _ in got)


def test_banned_cells_are_minus_inf_and_the_rest_keep_their_bits():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 12, generator=g)
    before = logits.clone()
    params = SamplingParams(bad_words=["x"])  # the forms are passed in: the engine tokenises the words
    forms = ((9,), (7, 8))
    apply_penalties(logits, [PenaltySpan(2, params, [1, 2], [3, 7], [(8,), (5,)], bad_words=forms)])
    inf = float("-inf")
    want = before.clone()
    want[2, 9] = want[2, 8] = inf  # after ...7: 8 (and 9 everywhere)
    want[3, 9] = inf  # after ...7 8
    want[4, 9] = inf  # after ...7 5
    assert torch.equal(logits, want)


@pytest.mark.parametrize("kw, words", [
    (dict(bad_words="cat"), "bad_words must be a list"),
    (dict(bad_words=["ok", " "]), "bad_words must be a list of words"),
    (dict(bad_words=["cat"], guided_regex="[a-z]+"), "bad_words cannot be combined with guided"),
    (dict(truncate_prompt_tokens=0), "truncate_prompt_tokens must be -1"),
    (dict(truncate_prompt_tokens=-2), "truncate_prompt_tokens must be -1"),
])
def test_refused_in_one_line(kw, words):
    with pytest.raises(ValueError, match=words):
        SamplingParams(**kw)
