"""Drafts end where the request does: a draft token past max_tokens - 1 - (tokens generated) would be
computed, verified and thrown away."""
import torch

from specserve.speculative.decoder import draft_room, within
from specserve.types import Draft, Request, SamplingParams


def test_room_is_what_a_verify_step_can_still_emit_less_its_own_token():
    r = Request("a", [1, 2, 3], SamplingParams(max_tokens=5))
    assert draft_room(r) == 4
    r.output_token_ids.extend([7, 8, 9])
    assert draft_room(r) == 1  # one draft token + the step's own = the last two tokens
    r.output_token_ids.append(10)
    assert draft_room(r) == 0


def test_within_cuts_chains_and_trees_by_depth():
    chain = Draft([5, 6, 7, 8], torch.rand(4, 10), [0.9, 0.8, 0.7, 0.6])
    assert within(chain, 9) is chain and within(chain, 4) is chain
    cut = within(chain, 2)
    assert cut.tokens == [5, 6] and cut.probs.shape == (2, 10) and cut.confidence == [0.9, 0.8] and not cut.is_tree
    assert within(chain, 0).tokens == []
    # a tree: 5 (depth 1) -> 6, 7 (depth 2) -> 8 under 6 (depth 3); 9 at depth 1
    tree = Draft([5, 6, 7, 8, 9], None, [0.9, 0.5, 0.4, 0.3, 0.1], parents=[-1, 0, 0, 1, -1])
    two = within(tree, 2)
    assert two.tokens == [5, 6, 7, 9] and two.parents == [-1, 0, 0, -1]
    assert within(tree, 3) is tree
    one = within(tree, 1)
    assert one.tokens == [5, 9] and one.is_tree
