"""What several speculative model tests check the same way: regular decoding's tokens on the tiny
pair's prompts (greedy and seeded), and a batched token tree against drafters.tree.expand's."""
import torch

from specserve import LLM, SamplingParams
from specserve.drafters.tree import rerank

PROMPTS = [[5, 6, 7, 8, 5, 6], [9, 40, 3, 9], [1, 2, 3]]
GREEDY = SamplingParams(temperature=0, max_tokens=24)
SEEDED = SamplingParams(temperature=0.8, max_tokens=24, seed=3)


def regular_tokens(target: str) -> tuple[list, list]:
    """Regular decoding's tokens for PROMPTS on the target: (greedy, seeded)."""
    base = LLM(target, kv_cache_gib=0.01, block_size=4)
    return ([o.outputs[0].token_ids for o in base.generate(PROMPTS, GREEDY)],
            [o.outputs[0].token_ids for o in base.generate(PROMPTS, SEEDED)])


def assert_tree_is_the_reference(d, ref, depth: int, cut_draft) -> None:
    """d, a drafter's tree, is ref (expand's) node for node, branched, with its cumulative confidences;
    cut_draft, the same drafter's tree with a budget of 6 nodes, is ref reranked to 6."""
    assert d.tokens == ref.tokens and d.parents == ref.parents and len(ref) > depth  # it branched
    torch.testing.assert_close(torch.tensor(d.cumulative()), torch.tensor(ref.scores), rtol=1e-4, atol=1e-6)
    cut = rerank(ref, 6)
    assert cut_draft.tokens == cut.tokens and cut_draft.parent_list() == cut.parents
