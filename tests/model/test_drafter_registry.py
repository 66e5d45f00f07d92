"""Adding a drafter is one file and one registry line: a toy drafter defined and registered here (as
its own file would be) is accepted by the config and the CLI, used by the engine, and stays lossless."""
import pytest

from specserve import LLM, SamplingParams
from specserve.config import SpeculativeConfig
from specserve.drafters.base import Drafter, Proposal
from specserve.registry import DRAFTERS
from specserve.types import Draft

from .tiny import make_tiny

pytest.importorskip("transformers")


# --- what the toy drafter's file would hold -----------------------------------------------------------
class RepeatDrafter(Drafter):
    """Drafts the request's last token again, max_len times (a guess: the engine must verify it)."""

    def __init__(self):
        self.proposals = 0

    def propose(self, requests, max_len, min_confidence=None, tree=None):
        self.proposals += 1
        return Proposal([Draft([r.token_at(r.num_tokens - 1)] * max_len, None, [0.5] * max_len) for r in requests])


def build(spec, ctx):
    return RepeatDrafter()


@pytest.fixture
def toy_registered():
    DRAFTERS.register("toy-repeat", build, "repeat the last token")  # ... and its registry line
    yield
    DRAFTERS.unregister("toy-repeat")


def test_a_registered_drafter_is_used_by_config_cli_and_engine(toy_registered, tmp_path):
    from specserve.cli.main import build_parser
    assert SpeculativeConfig(method="toy-repeat").method == "toy-repeat"
    assert build_parser().parse_args(["generate", "x", "--speculative", "toy-repeat"]).speculative == "toy-repeat"

    path = str(tmp_path / "tiny")
    make_tiny("llama", path)
    greedy = SamplingParams(temperature=0, max_tokens=24)
    prompts = [[1, 2, 3, 4, 5], [7, 7, 7, 7], [9, 40, 3]]
    ref = [o.outputs[0].token_ids for o in LLM(path, kv_cache_gib=0.01, block_size=4).generate(prompts, greedy)]
    llm = LLM(path, kv_cache_gib=0.01, block_size=4,
              speculative={"method": "toy-repeat", "policy": "fixed", "draft_len": 3, "fallback": False})
    out = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)]
    assert out == ref  # lossless whatever the drafter proposes
    stats = llm.spec_stats()
    assert llm.engine.speculator.drafter.proposals > 0 and stats["spec_steps"] > 0 and stats["drafted"] > 0


def test_an_unregistered_method_fails_with_the_choices():
    with pytest.raises(ValueError, match=r"unknown speculative method 'toy-repeat' \(choose from draft, lookup"):
        SpeculativeConfig(method="toy-repeat")


def test_auto_without_a_draft_model_drafts_with_lookup_and_suffix(tmp_path):
    """`auto` on a target no draft ships for, and none given: lookup and suffix drafting alone (it was
    refused), and lossless; `draft` itself still asks for a draft model."""
    path = str(tmp_path / "tiny")
    make_tiny("llama", path)
    greedy = SamplingParams(temperature=0, max_tokens=32)
    prompts = [[5, 6, 7, 8, 5, 6], [9, 40, 3, 9]]
    ref = [o.outputs[0].token_ids for o in LLM(path, kv_cache_gib=0.01, block_size=4).generate(prompts, greedy)]
    llm = LLM(path, kv_cache_gib=0.01, block_size=4, speculative={"method": "auto", "fallback": False})
    assert llm.engine.speculator.drafter.model is None
    # the second round repeats the first's requests: suffix drafting finds their continuations
    for _ in range(2):
        assert [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)] == ref
    chosen = llm.engine.speculator.drafter.chosen
    assert llm.spec_stats()["accepted"] > 0 and chosen["free"] > 0 and chosen["model"] == 0
    with pytest.raises(ValueError, match="no draft ships"):
        LLM(path, kv_cache_gib=0.01, block_size=4, speculative={"method": "draft"})
