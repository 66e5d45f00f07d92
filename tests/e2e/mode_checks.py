"""What the tests of an engine mode (int8 activations, the f16 KV cache) check the same way: within the
mode, greedy speculation gives the tokens of regular decoding one prompt at a time, at batch 1 and in
batches. fallback=False: the cost model must not turn speculation off and make the comparison trivial."""
from specserve import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=24)
# on the embedded model "draft" is its EAGLE head
SPECS = {"eagle-chain": dict(method="draft", policy="bass"),
         "eagle-tree": dict(method="draft", shape="tree", tree_top_k=3, tree_beam=2),
         "suffix": dict(method="suffix", policy="fixed", draft_len=5)}


def one_at_a_time(llm: LLM, texts: list[str]) -> list[list[int]]:
    """Regular decoding's greedy tokens, each prompt alone: the mode's reference."""
    return [llm.generate(p, GREEDY)[0].outputs[0].token_ids for p in texts]


def speculating(spec: dict, **mode) -> LLM:
    return LLM(speculative={**spec, "fallback": False}, kv_cache_gib=0.25, **mode)


def assert_speculation_gives(llm: LLM, texts: list[str], reference: list[list[int]], alone: int, batches) -> None:
    """The first `alone` prompts at batch 1, then the first n together for each n in batches: each gives
    the reference's tokens, and the engine really speculated."""
    assert one_at_a_time(llm, texts[:alone]) == reference[:alone]
    for n in batches:
        assert [o.outputs[0].token_ids for o in llm.generate(texts[:n], GREEDY)] == reference[:n], n
    stats = llm.spec_stats()
    assert stats["spec_steps"] > 0 and stats["accepted"] > 0  # it really speculated
