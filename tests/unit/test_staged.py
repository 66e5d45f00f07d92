"""Staged drafting keeps each stage's own draws: a stage's sampled draft tokens follow its own q
exactly, whatever the stage below proposes (kept with probability q(y), else a draw from q without y),
checked over 3 x 10^4 draft chains of a stage whose q is a known Markov chain; a planted bug (the draw
after a rejected proposal taken from q itself) makes the check fail. Greedy drafts are the stage's
argmax chain, and each round's KV bookkeeping keeps only rows computed on kept tokens."""

import pytest
import torch

from specserve.drafters import staged
from specserve.drafters.base import Drafter, Proposal
from specserve.drafters.common import DraftPicker
from specserve.drafters.staged import StagedDrafter
from specserve.types import Draft, Request, SamplingParams

V = 5
TABLE = torch.tensor([[2.0, 0.5, 1.0, -1.0, 0.0],
                      [0.0, 1.5, -0.5, 1.0, 0.3],
                      [1.0, 1.0, 0.2, 0.0, -2.0],
                      [-1.0, 0.0, 0.5, 2.0, 1.0],
                      [0.3, -0.3, 1.2, 0.0, 0.8]])  # logits of the next token given the current one
Q = torch.softmax(TABLE, -1)


class MarkovStage:
    """A stand-in for a draft model (the public methods a stage uses, as DraftModelDrafter's): logits
    depend on the row's own token only."""

    weight_bytes = 0

    def __init__(self):
        self.picker, self.drafted, self.done = DraftPicker(V, torch.device("cpu")), {}, {}
        self.rows_fed = []

    def reserve(self, request, num_tokens):
        self.done.setdefault(request.request_id, 0)
        return True

    def catch_up(self, requests, full_vocab=False):  # a full vocabulary already: full_vocab changes nothing
        spans = [[r.token_at(t) for t in range(self.done[r.request_id], r.num_tokens)] for r in requests]
        logits = self.score(requests, spans, [self.done[r.request_id] for r in requests])
        for r in requests:
            self.done[r.request_id] = r.num_tokens
        return logits, sum(len(s) for s in spans)

    def score(self, reqs, spans, starts, every_row=False, full_vocab=False):
        self.rows_fed.append([len(s) for s in spans])
        rows = [TABLE[t] for s in spans for t in (s if every_row else s[-1:])]
        return torch.stack(rows)

    def mark_drafted(self, request, rows):
        self.drafted[request.request_id] = (request.num_tokens, rows)

    def generator(self, request):
        return self.picker.generator(request)

    def truncate(self, request, valid):
        pass

    def observe(self, *a):
        pass

    def release(self, r):
        pass


class FixedProposals(Drafter):
    """Proposes the same tokens every round (a deterministic lower stage)."""

    def __init__(self, tokens):
        self.tokens, self.observed = tokens, []

    def propose(self, requests, max_len, min_confidence=None, tree=None):
        return Proposal([Draft(self.tokens[:max_len], None, [1.0] * min(max_len, len(self.tokens))) for _ in requests])

    def observe(self, request, start, hidden, num_accepted):
        self.observed.append(num_accepted)


def _draw_chains(n, k=3, seed=0):
    drafter = StagedDrafter(MarkovStage(), FixedProposals([1, 3, 3]), ["m", "fixed"])
    params = SamplingParams(temperature=1.0)
    chains = []
    for b in range(0, n, 1000):
        reqs = [Request(f"r{b + i}", [0], params, seed=seed + b + i) for i in range(1000)]
        chains += [d.tokens for d in drafter.propose(reqs, k).drafts]
    return torch.tensor(chains), drafter


def _within(tokens, p, sigmas=5.0):
    n = len(tokens)
    freq = torch.bincount(tokens, minlength=V).double() / n
    tol = sigmas * torch.sqrt(p.double() * (1 - p.double()) / n) + 1e-4
    return bool(((freq - p.double()).abs() <= tol).all())


def test_sampled_draft_tokens_follow_the_stage_distribution():
    chains, drafter = _draw_chains(30_000)
    assert chains.shape == (30_000, 3)
    assert _within(chains[:, 0], Q[0])  # the first token: from the catch-up row, no proposal
    for prev in (1, 3):  # later tokens: given the token before, with proposals kept or rejected
        assert _within(chains[:, 1][chains[:, 0] == prev], Q[prev])
        assert _within(chains[:, 2][chains[:, 1] == prev], Q[prev])
    assert 0 < drafter.kept and 0 < drafter.misses  # proposals were both kept and rejected


def test_planted_bug_is_caught(monkeypatch):
    monkeypatch.setattr(staged, "without", lambda q, y: q)  # the draw after a rejection ignores the rejection
    chains, _ = _draw_chains(30_000)
    assert not (_within(chains[:, 1][chains[:, 0] == 1], Q[1]) and _within(chains[:, 1][chains[:, 0] == 3], Q[3]))


def test_greedy_drafts_the_argmax_chain_in_fewer_passes_and_reports_kept_proposals():
    argmax = [0]
    for _ in range(6):
        argmax.append(int(TABLE[argmax[-1]].argmax()))
    stage, helper = MarkovStage(), FixedProposals(argmax[2:])  # proposes the right continuation
    drafter = StagedDrafter(stage, helper, ["m", "fixed"])
    r = Request("g", [0], SamplingParams(temperature=0))
    d = drafter.propose([r], 6).drafts[0]
    assert d.tokens == argmax[1:7]
    assert len(stage.rows_fed) == 2  # the catch-up, then one pass over [first token] + 4 proposals
    assert stage.rows_fed[1] == [5] and helper.observed == [4]
    assert stage.drafted["g"] == (1, 5)  # rows of every draft token but the last
    wrong = StagedDrafter(MarkovStage(), FixedProposals([4, 4, 4]), ["m", "fixed"])
    assert wrong.propose([Request("w", [0], SamplingParams(temperature=0))], 6).drafts[0].tokens == argmax[1:7]
    assert wrong.report()["stages"][0]["alpha"] == 0.0


def test_a_stage_is_run_through_its_public_methods_only():
    """StagedDrafter drives its stage model through DraftModelDrafter's public methods (reserve, catch_up,
    score, mark_drafted, truncate, generator) and its helper through the Drafter interface: no private
    attribute of another object, no type checks."""
    import ast
    import inspect
    tree = ast.parse(inspect.getsource(staged))
    private = sorted({n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr.startswith("_")
                      and not (isinstance(n.value, ast.Name) and n.value.id == "self")})
    assert private == []
    calls = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "isinstance" not in calls
    assert not {"kv", "proposed_at", "picker"} & {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}


def test_a_stage_may_be_a_known_models_name(monkeypatch):
    """--stages draft with --draft-model qwen2.5-coder-0.5b (a name, as --model takes it), or the name as
    a stage itself: resolved through the model registry (pulled if needed), not refused as a missing path."""
    from types import SimpleNamespace

    from specserve.drafters import staged
    from specserve.registry import MODELS
    name = MODELS.names()[0]
    seen = []
    monkeypatch.setattr(staged, "resolve_model_path", lambda m: seen.append(m) or __file__)
    monkeypatch.setattr(staged, "_is_eagle", lambda p: False)
    monkeypatch.setattr(staged, "load_model_drafter", lambda p, ctx, vocab, quant: ("loaded", p))
    ctx = SimpleNamespace(target_path="unused")
    assert staged._model_stage("draft", SimpleNamespace(draft_model=name, draft_vocab=0, draft_quant="none"), ctx) == ("loaded", __file__)
    assert staged._model_stage(name, SimpleNamespace(draft_model=None, draft_vocab=0, draft_quant="none"), ctx) == ("loaded", __file__)
    assert seen == [name, name]
    with pytest.raises(ValueError, match="no such model"):
        staged._model_stage("no-such-model", SimpleNamespace(draft_model=None), ctx)
