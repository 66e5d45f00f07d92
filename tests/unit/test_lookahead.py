"""Lookahead decoding's drafter (drafters/lookahead.py) without a model: its tree against the
paper's attention mask, and its Jacobi iterations against a toy greedy target, verified the way the
engine verifies trees (the longest path of the target's argmax), which must give the target's own
output and, on text the target repeats, more than one token per step."""
import random

import pytest

from specserve.drafters.lookahead import LookaheadDrafter
from specserve.types import Request, SamplingParams, TokenOrigin


def _request(prompt, rid="r"):
    return Request(rid, list(prompt), SamplingParams(temperature=0))


def _paths(draft):
    parents = draft.parent_list()
    out = []
    for j in range(len(draft.tokens)):
        path, k = [], j
        while k >= 0:
            path.append(draft.tokens[k])
            k = parents[k]
        out.append(tuple(reversed(path)))
    return out


def test_window_is_the_papers_mask():
    """W = 5, N = 4 (llama.cpp's example): level 0 is a chain from the root (its column 0 is the root),
    cell (level j, column i) sits at depth i + j below the root and sees exactly level 0 up to column
    i and its own column's levels before j."""
    W, N = 5, 4
    d = LookaheadDrafter(window=W, ngram=N, guesses=2)
    r = _request(range(1000, 1040))
    w = d._window(r)
    w.levels = [[100 * j + i for i in range(W)] for j in range(N - 1)]  # distinct tokens: cell (j, i) = 100 j + i
    draft = d.propose([r], max_len=16).drafts[0]
    assert draft.origin == TokenOrigin.LOOKAHEAD and draft.is_tree
    paths = dict(zip(draft.tokens, _paths(draft)))
    assert len(draft.tokens) == (W - 1) + (N - 2) * W  # no pool yet: the window only
    for j in range(N - 1):
        for i in range(W):
            if j == 0 and i == 0:
                continue  # the root's place
            want = tuple(range(1, i + 1)) + tuple(100 * k + i for k in range(1, j + 1))
            assert paths[100 * j + i] == want, (j, i)


def _greedy_walk(draft, after):
    """The engine's greedy tree verification: the longest path whose tokens are the target's argmax,
    then the target's token. after(path) -> the target's greedy token after the root + path."""
    parents = draft.parent_list()
    paths = _paths(draft)
    argmax = [after(())] + [after(p) for p in paths]
    node, accepted = -1, []
    while True:
        nxt = argmax[node + 1]
        child = next((c for c, p in enumerate(parents) if p == node and draft.tokens[c] == nxt), None)
        if child is None:
            return argmax, accepted, [draft.tokens[c] for c in accepted] + [nxt]
        accepted.append(child)
        node = child


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("W, N, G", [(4, 3, 4), (5, 4, 3), (1, 2, 2)])
def test_jacobi_iterations_are_lossless_and_find_repeats(seed, W, N, G):
    rng = random.Random(seed)
    V = 40
    # the toy target: its greedy token follows the last one around one cycle of all V tokens (text it
    # repeats), so every window trajectory runs along the text the sequence will follow
    order = list(range(V))
    rng.shuffle(order)
    follow = [0] * V
    for a, b in zip(order, order[1:] + order[:1]):
        follow[a] = b

    prompt = [rng.randrange(V) for _ in range(12)]
    r = _request(prompt)
    reference = [follow[prompt[-1]]]
    while len(reference) < 80:
        reference.append(follow[reference[-1]])
    d = LookaheadDrafter(window=W, ngram=N, guesses=G)
    steps = 0
    while len(r.output_token_ids) < 80:
        draft = d.propose([r], max_len=8).drafts[0]
        context = r.all_token_ids
        argmax, path, emitted = _greedy_walk(draft, lambda p, c=context: follow[(c + list(p))[-1]])
        d.observe_span(r, draft, argmax, path)
        r.output_token_ids.extend(emitted)
        steps += 1
    assert r.output_token_ids[:80] == reference
    if W * (N - 1) > 1:  # a real window: its trajectories find the target's cycle
        assert 80 / steps > 1.5, steps
        assert d.confidence(0) > 0.3  # the pool's guesses were measured right more often than the prior


def test_pool_guesses_alone_on_plain_steps_and_state_per_request():
    d = LookaheadDrafter(window=3, ngram=3, guesses=2)
    a, b = _request([1, 2, 3, 4], "a"), _request([1, 2, 3, 4], "b")
    assert d.propose_free([a], 8).drafts[0].tokens == []  # an empty pool: nothing to verify for free
    w = d._window(a)
    w.pool[4] = [(5, 6), (7, 8)]
    free = d.propose_free([a, b], 8).drafts
    assert sorted(_paths(free[0])) == [(5,), (5, 6), (7,), (7, 8)]
    assert free[1].tokens == []  # b has a pool of its own
    d.fork(a, b)
    assert d._window(b).pool == w.pool and d._window(b).pool is not w.pool
    d.release(a)
    assert "a" not in d.windows


@pytest.mark.parametrize("kwargs, message", [
    (dict(window=0), "window >= 1"), (dict(ngram=1), "ngram >= 2"), (dict(guesses=-1), "guesses >= 0")])
def test_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LookaheadDrafter(**kwargs)


def test_cli_flags_map_to_the_config_one_to_one():
    """Every SpeculativeConfig field has its flag, and the flags land in the config (the lookahead
    ones included)."""
    from specserve.cli.main import build_parser, spec_from_args
    from specserve.config import SpeculativeConfig
    args = build_parser().parse_args(["generate", "x", "--speculative", "lookahead", "--lookahead-window", "6",
                                      "--lookahead-ngram", "4", "--lookahead-guesses", "2", "--draft-model", "/tmp",
                                      "--ngram-model", "/tmp"])
    spec = spec_from_args(args)
    assert set(spec) == set(SpeculativeConfig.__dataclass_fields__)
    cfg = SpeculativeConfig.from_any(spec)
    assert (cfg.method, cfg.lookahead_window, cfg.lookahead_ngram, cfg.lookahead_guesses) == ("lookahead", 6, 4, 2)
    with __import__("pytest").raises(ValueError, match="lookahead_guesses must be at most 14"):
        SpeculativeConfig(method="lookahead", lookahead_guesses=15)
