"""The CUDA-graph step's plan and static buffers, on CPU: which steps replay which captured size,
and what the buffers hold for a padded batch of decodes, chains and trees."""
import numpy as np
import pytest
import torch

from specserve.attention.paged import AttentionMetadata, ancestor_mask
from specserve.cuda.buffers import NO_TREE, StaticInputs, ancestor_rows
from specserve.cuda.plan import MAX_GRAPH_Q, StepShape, capture_sizes, graph_size, padded_size


def test_capture_sizes_cover_every_count_up_to_the_largest():
    sizes = capture_sizes(128)
    assert sizes == sorted(set(sizes)) and sizes[0] == 1 and sizes[-1] == 128
    assert capture_sizes(10) == [1, 2, 3, 4, 6, 8, 10]
    for n in range(1, 129):  # padding adds less than half a step past 8 tokens
        p = padded_size(n, sizes)
        assert p >= n and (n <= 8 or p < 1.5 * n), (n, p)
    assert padded_size(129, sizes) is None
    with pytest.raises(ValueError):
        capture_sizes(0)


def test_graph_size_takes_decode_and_verify_steps_only():
    sizes = capture_sizes(64)
    assert graph_size(StepShape((1,) * 8), sizes, 16, 64) == 8
    assert graph_size(StepShape((5,) * 8), sizes, 16, 64) == 48  # batch 8 x (1 + K=4) = 40 -> 48
    assert graph_size(StepShape((1, 5, 3)), sizes, 16, 64) == 12  # ragged spans pad as flat tokens
    assert graph_size(StepShape((1, MAX_GRAPH_Q + 1)), sizes, 16, 64) is None  # a prompt chunk: eager
    assert graph_size(StepShape((1,) * 17), sizes, 16, 64) is None  # more sequences than the buffers
    assert graph_size(StepShape((16,) * 5), sizes, 16, 64) is None  # past the largest graph
    assert graph_size(StepShape((4, 1), max_span=65), sizes, 16, 64) is None  # a tree wider than its mask
    assert graph_size(StepShape(()), sizes, 16, 64) is None


def test_ancestor_rows_match_the_reference_mask():
    par = [-1, 0, 0, 1, 3, -1, 5]
    assert np.array_equal(ancestor_rows(par), ancestor_mask(par).numpy().astype(np.uint8))


def _step():
    # a decode (kv 7), a chain of 1 + 3 (kv 9) and a tree of 4 rows whose last 3 are queries (kv 8)
    q_lens, kv_lens = [1, 4, 3], [7, 9, 8]
    tables = [[0, 1], [2, 3, 4], [5, 6]]
    trees = [None, None, [-1, 0, 0, 1]]
    return q_lens, kv_lens, tables, trees


def test_fill_writes_slots_limits_trees_and_pads():
    q_lens, kv_lens, tables, trees = _step()
    inp = StaticInputs(16, 4, 4, 8, 4, torch.device("cpu"))
    T = sum(q_lens)
    ids, pos = list(range(100, 100 + T)), list(range(T))
    inp.fill(ids, pos, q_lens, kv_lens, tables, trees, 12)
    meta = AttentionMetadata.build(q_lens, kv_lens, tables, 4, torch.device("cpu"))
    assert inp.slots[:T].tolist() == meta.slot_mapping.tolist()  # the engine's own slot mapping
    assert inp.slots[T:12].tolist() == [-1] * (12 - T)  # padding writes nowhere
    assert inp.limit[:T].tolist() == [6, 5, 6, 7, 8, 5, 6, 7]  # causal: kv_len - q_len + i
    assert inp.limit[T:12].tolist() == [-1] * (12 - T)  # padding sees nothing
    assert inp.seq[:T].tolist() == [0, 1, 1, 1, 1, 2, 2, 2]
    assert inp.ids[:T].tolist() == ids and inp.ids[T:12].tolist() == [0] * (12 - T)
    assert inp.span_start[:3].tolist() == [NO_TREE, NO_TREE, 4]  # the tree's rows are kv 4 .. 7
    assert inp.tables[1].tolist() == [2, 3, 4, 0] and inp.tables[0].tolist() == [0, 1, 0, 0]
    expect = ancestor_mask(trees[2])[1:].to(torch.int32)  # the 3 queries' rows of the 4-row tree
    assert torch.equal(inp.tree[5:8, :4], expect)
    # a second, smaller step: everything past it is padding again, nothing stale is live
    inp.fill([1], [9], [1], [10], [[7, 8, 9]], [None], 1)
    assert inp.limit[0].item() == 9 and inp.slots[0].item() == 9 * 4 + 1 and inp.num_tokens == 1


def test_fill_refuses_what_does_not_fit():
    inp = StaticInputs(8, 2, 2, 4, 4, torch.device("cpu"))
    assert not inp.fits([1, 1, 1], [[0]] * 3, [None] * 3)  # sequences
    assert not inp.fits([1], [[0, 1, 2]], [None])  # a block table past max_blocks
    assert not inp.fits([5], [[0, 1]], [[-1, 0, 1, 2, 3]])  # a tree wider than the mask
    with pytest.raises(ValueError):
        inp.fill([1, 2], [0, 1], [2], [2], [[0]], [None], 1)  # padded below the step


def test_clear_makes_every_row_padding():
    inp = StaticInputs(8, 2, 2, 4, 4, torch.device("cpu"))
    inp.fill([5, 6], [0, 1], [2], [2], [[1]], [None], 2)
    inp.clear()
    assert inp.slots.tolist() == [-1] * 8 and inp.limit.tolist() == [-1] * 8


def test_fill_matches_the_engines_slot_mapping_on_random_steps():
    """fill's vectorised rows against AttentionMetadata's slot mapping (the engine's reference) and the
    causal limits, over random ragged steps of decodes, verify spans and prompt chunks."""
    g = torch.Generator().manual_seed(0)
    bs, inp = 4, StaticInputs(64, 6, 8, 8, 4, torch.device("cpu"))
    for _ in range(50):
        B = int(torch.randint(1, 7, (1,), generator=g))
        q_lens = torch.randint(1, 9, (B,), generator=g).tolist()
        kv_lens = [q + int(torch.randint(0, 20, (1,), generator=g)) for q in q_lens]
        tables = [torch.randperm(40, generator=g)[:-(-k // bs)].tolist() for k in kv_lens]
        T = sum(q_lens)
        inp.fill(list(range(T)), list(range(T)), q_lens, kv_lens, tables, [None] * B, T)
        meta = AttentionMetadata.build(q_lens, kv_lens, tables, bs, torch.device("cpu"))
        assert inp.slots[:T].tolist() == meta.slot_mapping.tolist()
        assert inp.limit[:T].tolist() == [k - q + i for q, k in zip(q_lens, kv_lens) for i in range(q)]
        assert inp.seq[:T].tolist() == [b for b, q in enumerate(q_lens) for _ in range(q)]
        assert inp.span_start[:B].tolist() == [NO_TREE] * B
