import pytest

from specserve.kv.block_manager import BlockManager, NoFreeBlocksError


def test_allocate_grows_table_and_uses_free_list():
    bm = BlockManager(num_blocks=4, block_size=4)
    t = []
    bm.allocate(t, 5)  # 5 tokens -> 2 blocks
    assert len(t) == 2 and bm.num_free_blocks == 2
    bm.allocate(t, 8)  # still 2 blocks
    assert len(t) == 2
    bm.allocate(t, 9)
    assert len(t) == 3 and bm.num_free_blocks == 1
    assert bm.slot(t, 0) == t[0] * 4 and bm.slot(t, 6) == t[1] * 4 + 2


def test_out_of_blocks_raises_and_changes_nothing():
    bm = BlockManager(num_blocks=2, block_size=4)
    t = []
    with pytest.raises(NoFreeBlocksError):
        bm.allocate(t, 9)
    assert t == [] and bm.num_free_blocks == 2


def test_truncate_rolls_back_tail_blocks():
    bm = BlockManager(num_blocks=8, block_size=4)
    t = []
    bm.allocate(t, 13)  # 4 blocks
    last = t[-1]
    bm.truncate(t, 9)  # 9 tokens still need 3 blocks
    assert len(t) == 3 and bm.num_free_blocks == 5 and last in bm.free_blocks
    bm.truncate(t, 8)
    assert len(t) == 2


def test_fork_shares_full_blocks_and_copies_partial():
    bm = BlockManager(num_blocks=8, block_size=4)
    parent = []
    bm.allocate(parent, 10)  # 2 full + 1 partial
    child, copies = bm.fork(parent, 10)
    assert child[:2] == parent[:2] and child[2] != parent[2]
    assert copies == [(parent[2], child[2])]
    assert bm.ref_counts[parent[0]] == 2
    bm.free(parent)
    assert bm.ref_counts[child[0]] == 1 and child[0] not in bm.free_blocks
    bm.free(child)
    assert bm.num_free_blocks == 8


def test_fork_at_block_boundary_copies_nothing():
    bm = BlockManager(num_blocks=4, block_size=4)
    parent = []
    bm.allocate(parent, 8)
    child, copies = bm.fork(parent, 8)
    assert child == parent and copies == []


def test_double_free_is_caught():
    bm = BlockManager(num_blocks=2, block_size=4)
    t = []
    bm.allocate(t, 1)
    b = t[0]
    bm.free(t)
    with pytest.raises(RuntimeError):
        bm._release(b)
