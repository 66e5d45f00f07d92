"""One owner per draft (issue 42): the controller's propose returns the step's DraftBatch, guided pruning
maps it to another, the scheduler records each draft in its ScheduledRequest, and after verification
the drafter is told, in one explicit call, whose draft was verified and how much of it was accepted.

A drafter registered here (as any method is, in registry.DRAFTERS) runs in the engine on the embedded
model: every on_verified it receives names the draft the target verified (the very object it
proposed; for a guided request, that draft pruned to what the grammar allows) and the number of its
tokens the greedy target accepted, checked against the output itself. An AST scan of the package
checks that no module but the scheduler and the controller writes a request's draft."""
import ast
import pathlib

import pytest

from specserve import LLM, SamplingParams
from specserve.drafters.base import Drafter, Proposal
from specserve.drafters.prompt_lookup import PromptLookupDrafter
from specserve.registry import DRAFTERS
from specserve.types import Draft, TokenOrigin
from specserve_bench.humaneval import humaneval_prompts

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "specserve"
# the only writers of a draft: the scheduler (ScheduledRequest) and the controller (propose, learn)
OWNERS = {"scheduler/scheduler.py", "speculative/decoder.py"}


class Recorder(Drafter):
    """Copies (prompt lookup; the last token twice where there is none) as chains, or as trees (each
    copied token with a wrong sibling), or with a tail a grammar refuses. Records its proposals and
    every on_verified: (request, draft, accepted, the request's output length then)."""

    origin = TokenOrigin.LOOKUP

    def __init__(self):
        self.lookup = PromptLookupDrafter(4)
        self.mode = "chain"  # "chain", "tree" or "junk": the chain, then `junk` tokens
        self.junk: list[int] = []
        self.proposed: dict[str, Draft] = {}
        self.calls: list = []

    def propose(self, requests, max_len, min_confidence=None, tree=None):
        drafts = []
        for r, copy in zip(requests, self.lookup.propose(requests, max_len).drafts):
            chain = copy.tokens or [r.token_at(r.num_tokens - 1)] * min(2, max_len)
            if self.mode == "tree":  # each node gets a sibling that the target (almost) never picks
                n = len(chain)
                d = Draft(chain + [(t + 1) % 1000 for t in chain], None, [0.9] * 2 * n,
                          list(range(-1, n - 1)) * 2, TokenOrigin.LOOKUP)
            else:
                tokens = chain + (self.junk if self.mode == "junk" else [])
                d = Draft(tokens, None, [0.9] * len(tokens), origin=TokenOrigin.LOOKUP)
            self.proposed[r.request_id] = d
            drafts.append(d)
        return Proposal(drafts)

    def on_verified(self, request, draft, accepted):
        self.calls.append((request, draft, accepted, len(request.output_token_ids), self.proposed[request.request_id]))

    def release(self, request):
        self.lookup.release(request)


@pytest.fixture(scope="module")
def recorded():
    made: list[Recorder] = []

    def build(spec, ctx):
        made.append(Recorder())
        return made[-1]

    DRAFTERS.register("test-recorder", build, "records on_verified (tests/unit/test_draft_handoff.py)")
    try:
        llm = LLM(speculative={"method": "test-recorder", "policy": "fixed", "draft_len": 4, "fallback": False},
                  kv_cache_gib=0.25, max_num_seqs=8)
        yield llm, made[0]
    finally:
        DRAFTERS.unregister("test-recorder")


def _check_greedy_acceptance(calls):
    """Each call's accepted count is what greedy verification of its draft gives against the output:
    the accepted path's tokens are the output's at the draft's position, and no child of the last
    accepted node is the token the target put after them."""
    checked = 0
    for r, d, accepted, pos, _ in calls:
        out = r.output_token_ids
        paths = d.paths()
        assert 0 <= accepted <= max(d.depths())
        if pos + accepted >= len(out):  # the request finished inside this step's tokens
            continue
        path = tuple(out[pos:pos + accepted])
        assert accepted == 0 or path in paths, "the accepted tokens are not a path of the verified draft"
        children = {p[-1] for p in paths if len(p) == accepted + 1 and p[:-1] == path}
        assert out[pos + accepted] not in children, "greedy verification stopped short of a matching token"
        checked += 1
    assert checked > 10


def _check_stats(calls, requests):
    """One on_verified per verify step of each request, with the counts its statistics recorded."""
    for r in requests:
        mine = [(len(d.tokens), a) for q, d, a, _, _ in calls if q is r]
        assert mine == list(zip(r.spec_drafted, r.spec_accepted)) and mine
        assert all(o == TokenOrigin.LOOKUP for o in r.spec_origin)


def _generate(llm, drafter, mode, params, batch=4):
    drafter.mode, drafter.calls = mode, []
    prompts = humaneval_prompts(batch)
    llm.generate(prompts, params)
    return drafter.calls, list({id(c[0]): c[0] for c in drafter.calls}.values())


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_on_verified_gets_the_verified_draft_and_its_accepted_count(recorded, mode):
    llm, drafter = recorded
    calls, requests = _generate(llm, drafter, mode, SamplingParams(temperature=0, max_tokens=32))
    assert len(requests) == 4
    # no selection (fallback off) and no grammar: the draft verified is the very one proposed, or, in a
    # request's last steps, the proposed one cut to what the request can still emit (decoder.draft_room)
    for _, d, _, pos, proposed in calls:
        assert d is proposed or (set(d.paths()) < set(proposed.paths()) and pos + max(d.depths()) == 32 - 1)
    assert sum(d is proposed for _, d, _, _, proposed in calls) > len(calls) // 2
    assert all(d.is_tree == (mode == "tree") for _, d, _, _, _ in calls)
    assert any(a > 0 for _, _, a, _, _ in calls) and any(a < max(d.depths()) for _, d, a, _, _ in calls)
    _check_greedy_acceptance(calls)
    _check_stats(calls, requests)


def test_on_verified_gets_the_guided_pruned_draft(recorded):
    llm, drafter = recorded
    tok = llm.tokenizer
    drafter.junk = tok.encode("a", add_special_tokens=False)[:1] + tok.encode("7", add_special_tokens=False)[:1]
    params = SamplingParams(temperature=0, max_tokens=24, guided_regex="[0-9]{30}")
    calls, requests = _generate(llm, drafter, "junk", params)
    assert len(requests) == 4
    pruned = 0
    for _, d, _, _, proposed in calls:
        # what the grammar allows of the proposal: a prefix (greedy: the refused token and all after it go)
        assert d.tokens == proposed.tokens[:len(d.tokens)] and d.origin == TokenOrigin.LOOKUP
        assert drafter.junk[0] not in d.tokens
        pruned += len(d.tokens) < len(proposed.tokens)
    assert pruned > 10
    _check_greedy_acceptance(calls)
    _check_stats(calls, requests)
    assert all(tok.decode(r.output_token_ids).isdigit() for r in requests)


def _draft_writes(tree: ast.AST) -> list[int]:
    """Lines writing a draft onto something other than `self`: `x.draft = ...` (also augmented or
    annotated), `setattr(x, "draft", ...)`, and `Request(..., draft=...)`."""
    lines = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            for sub in ast.walk(t):
                if isinstance(sub, ast.Attribute) and sub.attr == "draft" and \
                        not (isinstance(sub.value, ast.Name) and sub.value.id == "self"):
                    lines.append(node.lineno)
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name == "setattr" and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                    and node.args[1].value == "draft":
                lines.append(node.lineno)
            if name == "Request" and any(k.arg == "draft" for k in node.keywords):
                lines.append(node.lineno)
    return lines


def _stat_writes(tree: ast.AST) -> list[int]:
    """Lines appending to (or assigning) a request's spec_drafted / spec_accepted / spec_origin."""
    stats = {"spec_drafted", "spec_accepted", "spec_origin"}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                isinstance(node.func.value, ast.Attribute) and node.func.value.attr in stats:
            lines.append(node.lineno)
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                if isinstance(t, ast.Attribute) and t.attr in stats:
                    lines.append(node.lineno)
    return lines


def test_only_the_scheduler_and_the_controller_write_a_requests_draft():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 50
    writers, stat_writers = {}, {}
    for path in files:
        rel = path.relative_to(PACKAGE).as_posix()
        tree = ast.parse(path.read_text(), filename=str(path))
        if (lines := _draft_writes(tree)) and rel not in OWNERS:
            writers[rel] = lines
        if (lines := _stat_writes(tree)) and rel != "speculative/decoder.py":
            stat_writers[rel] = lines
    assert writers == {}, f"modules writing a request's draft: {writers}"
    # the per-request statistics are recorded in one place (the controller's learn)
    assert stat_writers == {}, f"modules writing a request's speculation statistics: {stat_writers}"
    from specserve.types import Request
    assert "draft" not in Request.__dataclass_fields__  # the draft lives in the step's ScheduledRequest
    assert not hasattr(Request, "verified_draft_of")


def test_the_scan_finds_a_draft_written_from_outside():
    planted = ast.parse("def f(r, d):\n    r.draft = d\n    self.draft = d\n    setattr(r, 'draft', d)\n"
                        "    Request('a', [1], p, draft=d)\n    r.spec_drafted.append(1)\n")
    assert _draft_writes(planted) == [2, 4, 5]
    assert _stat_writes(planted) == [6]
