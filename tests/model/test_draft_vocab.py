"""A draft model's reduced vocabulary (FR-Spec, drafters/vocab.py): its head computes logits over the
most frequent tokens only, and speculation stays lossless, plain and staged, greedy and seeded."""
import numpy as np
import pytest

from specserve import LLM
from specserve.drafters import vocab

from .spec_checks import GREEDY, PROMPTS, SEEDED, regular_tokens
from .tiny import VOCAB, make_tiny

pytest.importorskip("transformers")


@pytest.fixture
def pair(tmp_path, monkeypatch):
    target, draft = str(tmp_path / "target"), str(tmp_path / "draft")
    make_tiny("llama", target, seed=0)
    make_tiny("llama", draft, seed=1)
    counts = np.arange(VOCAB)[::-1].copy()  # token 0 the most frequent
    monkeypatch.setattr(vocab, "stdlib_counts", lambda tokenizer: counts)  # not the stdlib for a byte vocabulary
    return target, draft


def test_the_most_frequent_tokens_and_every_added_one():
    class Tok:
        eos_token_ids = [9]

        class backend:
            @staticmethod
            def get_added_tokens_decoder():
                return {7: "<|im_end|>"}

    ids = vocab.frequent_vocab(Tok, 3, counts=np.array([5, 1, 9, 0, 7, 2, 2, 0, 0, 0]))
    assert ids.tolist() == [0, 2, 4, 7, 9]


@pytest.mark.parametrize("method", ["draft", "staged"])
def test_a_reduced_draft_vocabulary_stays_lossless(pair, method):
    target, draft = pair
    prompts, greedy, seeded = PROMPTS, GREEDY, SEEDED
    ref, ref_seeded = regular_tokens(target)
    spec = dict(method=method, draft_model=draft, draft_vocab=64, policy="fixed", draft_len=3, fallback=False)
    if method == "staged":
        spec["stages"] = ["draft", "lookup"]
    llm = LLM(target, kv_cache_gib=0.01, block_size=4, speculative=spec)
    drafter = llm.engine.speculator.drafter
    model_drafter = drafter.model if method == "staged" else drafter
    assert model_drafter.vocab_ids.tolist() == list(range(64))  # the 64 most frequent (no added tokens here)
    outs = llm.generate(prompts, greedy)
    assert [o.outputs[0].token_ids for o in outs] == ref
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, seeded)] == ref_seeded
    drafted = [t for o in outs for t, origin in zip(o.outputs[0].token_ids, o.outputs[0].origins) if origin == "draft"]
    assert llm.spec_stats()["drafted"] > 0
    assert all(t < 64 for t in drafted)  # what the draft model proposes comes from its reduced head
