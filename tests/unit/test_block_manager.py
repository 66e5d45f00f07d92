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


# --- prefix caching ---------------------------------------------------------------------------------
def _seq(tokens):
    return lambda a, b: tokens[a:b]


def test_prefix_blocks_are_shared_after_registration_and_only_whole_matching_blocks():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    a_tokens = list(range(10))
    a = []
    bm.allocate(a, 10)
    assert bm.match_prefix(a_tokens, 9) == []  # nothing registered yet
    bm.register(a, _seq(a_tokens), 10)  # 2 full blocks; the partial third is not shareable
    assert bm.num_cached_blocks == 2
    b = bm.match_prefix(a_tokens + [99], 10)
    assert b == a[:2] and bm.ref_counts[a[0]] == 2
    # a different second block: only the first is shared; a different first block: none
    assert bm.match_prefix([0, 1, 2, 3, 4, 5, 6, 77, 8], 8) == a[:1]
    assert bm.match_prefix([9, 1, 2, 3, 4, 5, 6, 7], 8) == []
    # max_tokens caps the match (the engine always computes a prompt's last token)
    assert bm.match_prefix(a_tokens, 7) == a[:1]


def test_same_block_tokens_after_another_prefix_do_not_match():
    """Keys chain by the parent block: equal tokens after a different prefix are other KV."""
    bm = BlockManager(num_blocks=8, block_size=2, enable_prefix_caching=True)
    t, u, a, b = [1, 2, 3, 4], [5, 6, 7, 8], [], []
    bm.allocate(a, 4)
    bm.allocate(b, 4)
    bm.register(a, _seq(t), 4)
    bm.register(b, _seq(u), 4)
    # (7, 8) is cached, but after (5, 6): after (1, 2) it is other KV
    assert bm.match_prefix([1, 2, 7, 8], 4) == a[:1]
    assert bm.match_prefix([1, 2, 3, 4], 4) == a


def test_freed_cached_blocks_are_reused_until_evicted_lru_and_fresh_blocks_go_first():
    bm = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    t, a = [1, 2, 3, 4], []
    bm.allocate(a, 4)
    bm.register(a, _seq(t), 4)
    blocks_a = list(a)
    bm.free(a)
    assert bm.num_free_blocks == 4 and bm.num_cached_blocks == 2
    other = []
    bm.allocate(other, 4)  # the two never-registered blocks first: the cached prefix survives
    assert not set(other) & set(blocks_a)
    hit = bm.match_prefix(t, 4)
    assert hit == blocks_a and bm.num_free_blocks == 0
    bm.free(hit)
    bm.free(other)
    third = []
    bm.allocate(third, 8)  # all four: the registered ones are evicted, least recently freed first
    assert bm.num_cached_blocks == 0 and bm.match_prefix(t, 4) == []
    bm.free(third)
    assert bm.num_free_blocks == 4


def test_a_second_table_with_the_same_tokens_registers_privately_and_frees_cleanly():
    bm = BlockManager(num_blocks=6, block_size=2, enable_prefix_caching=True)
    t = [1, 2, 3, 4]
    a, b = [], []
    bm.allocate(a, 4)
    bm.allocate(b, 4)  # computed the same prefix in the same step
    bm.register(a, _seq(t), 4)
    bm.register(b, _seq(t), 4)
    assert bm.num_cached_blocks == 2
    hit = bm.match_prefix(t, 4)
    assert hit == a
    first_of_b = b[0]
    for table in (hit, a, b):
        bm.free(table)
    assert bm.num_free_blocks == 6
    with pytest.raises(RuntimeError):
        bm.free([first_of_b])


def test_register_walks_only_new_blocks_and_is_off_without_prefix_caching():
    bm = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=True)
    seen = []
    t, a = [1, 2, 3, 4, 5, 6], []
    bm.allocate(a, 6)

    def tokens(x, y):
        seen.append((x, y))
        return t[x:y]
    bm.register(a, tokens, 4)
    bm.register(a, tokens, 5)  # no new full block
    bm.register(a, tokens, 6)
    assert seen == [(0, 2), (2, 4), (4, 6)]
    off = BlockManager(num_blocks=4, block_size=2)
    c = []
    off.allocate(c, 4)
    off.register(c, _seq(t), 4)
    assert off.num_cached_blocks == 0 and off.match_prefix(t, 4) == []
