"""Token trees proposed by a standalone draft model (drafters/draft_model.py with drafters/tree.grow):
the batched, level-by-level tree equals drafters.tree.expand driven by the draft run as a plain chain
along each path, and speculation with trees gives regular decoding's tokens."""
import pytest
import torch

from specserve import LLM, SamplingParams
from specserve.drafters import TreeShape
from specserve.drafters.tree import expand
from specserve.types import Request

from .spec_checks import GREEDY, PROMPTS, SEEDED, assert_tree_is_the_reference, regular_tokens
from .tiny import make_tiny

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    target, draft = str(root / "target"), str(root / "draft")
    make_tiny("llama", target, seed=0)
    make_tiny("llama", draft, seed=1)
    return target, draft


@pytest.mark.parametrize("attention", ["split", "pad"])
def test_draft_model_trees_equal_the_reference_expansion(pair, attention):
    target, draft = pair
    llm = LLM(target, kv_cache_gib=0.01, block_size=4,
              speculative=dict(method="draft", draft_model=draft, attention=attention))
    drafter = llm.engine.speculator.drafter
    assert drafter.makes_trees
    g = torch.Generator().manual_seed(3)
    reqs = [Request(f"r{i}", torch.randint(0, 64, (n,), generator=g).tolist(), SamplingParams(temperature=0))
            for i, n in enumerate((9, 14))]

    def fresh():
        for r in reqs:
            drafter.release(r)

    depth, shape = 4, TreeShape(top_k=3, beam=2, max_nodes=100)
    fresh()
    drafts = drafter.propose(reqs, depth, None, shape).drafts

    def reference(r):
        def next_topk(paths, k):
            out = []
            for path in paths:  # the draft model over the prompt and the path, from an empty cache
                fresh()
                assert drafter.reserve(r, r.num_tokens + len(path))
                logits = drafter.score([r], [[r.token_at(t) for t in range(r.num_tokens)] + path], [0])
                p, ids = torch.softmax(logits.float(), -1)[0].topk(k)
                out.append((ids.tolist(), p.tolist()))
            return out
        return expand(next_topk, depth, shape.top_k, shape.beam)

    for r, d in zip(reqs, drafts):
        ref = reference(r)
        fresh()  # cut to a node budget: the reranked reference
        assert_tree_is_the_reference(d, ref, depth, drafter.propose([r], depth, None, TreeShape(3, 2, max_nodes=6)).drafts[0])


@pytest.mark.parametrize("method", ["draft", "auto"])
def test_draft_model_trees_give_regular_decodings_tokens(pair, method):
    """Greedy and seeded, batch 1 and 3, trees forced (no fallback): the tokens regular decoding gives;
    after each verification the draft catches up on the accepted path (no tree row is kept)."""
    target, draft = pair
    prompts, greedy, seeded = PROMPTS, GREEDY, SEEDED
    ref, ref_seeded = regular_tokens(target)
    spec = dict(method=method, draft_model=draft, policy="fixed", draft_len=3, fallback=False, shape="tree",
                tree_top_k=2, tree_beam=2, tree_max_nodes=6)
    llm = LLM(target, kv_cache_gib=0.01, block_size=4, speculative=spec)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts[:1], greedy)] == ref[:1]
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)] == ref
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, seeded)] == ref_seeded
    stats = llm.spec_stats()
    assert stats["tree_spans"] > 0 and stats["mean_tree_nodes"] > 3  # trees were verified, not chains
