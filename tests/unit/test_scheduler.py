import pytest

from specserve.kv.block_manager import BlockManager
from specserve.scheduler.scheduler import Scheduler
from specserve.types import Request, RequestStatus, SamplingParams


def req(i, n_prompt):
    return Request(str(i), list(range(1, n_prompt + 1)), SamplingParams(max_tokens=4))


def advance(out):
    """What the engine does after the model ran: a token for every request whose step samples
    (schedule() already moved num_computed_tokens past the step)."""
    for s in out.scheduled:
        assert s.request.num_computed_tokens == s.start + s.num_new_tokens
        if s.samples:
            s.request.output_token_ids.append(7)


def test_prefill_then_decode_and_chunking():
    s = Scheduler(BlockManager(64, 4), max_num_seqs=8, max_num_batched_tokens=10)
    a, b = req(0, 6), req(1, 7)
    s.add(a), s.add(b)
    out = s.schedule()
    assert [(x.request.request_id, x.num_new_tokens) for x in out.scheduled] == [("0", 6), ("1", 4)]
    assert out.scheduled[0].samples and not out.scheduled[1].samples  # b's prompt is chunked
    advance(out)
    out = s.schedule()
    assert [(x.request.request_id, x.num_new_tokens) for x in out.scheduled] == [("0", 1), ("1", 3)]
    assert all(x.samples for x in out.scheduled)


def test_max_num_seqs_limits_admission():
    s = Scheduler(BlockManager(64, 4), max_num_seqs=2, max_num_batched_tokens=100)
    for i in range(3):
        s.add(req(i, 3))
    out = s.schedule()
    assert len(out.scheduled) == 2 and len(s.waiting) == 1


def test_preemption_frees_blocks_and_requeues():
    bm = BlockManager(4, 4)  # 16 token slots
    s = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=100)
    a, b = req(0, 8), req(1, 8)
    s.add(a), s.add(b)
    advance(s.schedule())  # both prefilled: all 4 blocks used, each has 9 tokens now
    out = s.schedule()  # both need a 3rd block: b (newest) is preempted
    assert out.preempted == [b] and b.num_computed_tokens == 0 and b.block_table == []
    assert b.status == RequestStatus.WAITING and s.waiting[0] is b
    assert [x.request for x in out.scheduled] == [a]


def test_finish_frees_blocks():
    bm = BlockManager(8, 4)
    s = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=100)
    a = req(0, 5)
    s.add(a)
    s.schedule()
    s.finish(a)
    assert bm.num_free_blocks == 8 and not s.has_unfinished()



# --- roll-back: the scheduler's, after verification rejected drafts ---------------------------------
def decoding_with_draft(s, prompt_len, num_drafts):
    """A request prefilled and decoding, then scheduled with num_drafts draft tokens."""
    from specserve.types import Draft
    r = req(0, prompt_len)
    s.add(r)
    advance(s.schedule())
    draft = Draft(list(range(100, 100 + num_drafts)))
    out = s.schedule({r.request_id: draft})
    assert out.scheduled[0].num_draft_tokens == num_drafts and out.scheduled[0].num_new_tokens == 1 + num_drafts
    assert out.scheduled[0].draft is draft  # recorded where the step reads it
    return r


def test_rollback_within_a_partial_block_keeps_the_block():
    bm = BlockManager(16, 4)
    s = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=100)
    r = decoding_with_draft(s, 5, 2)  # 5 prompt + 1 output + 2 drafts: 8 tokens, 2 blocks
    assert r.num_computed_tokens == 8 and len(r.block_table) == 2
    s.rollback(r, 1)  # one draft rejected: 7 tokens still need both blocks
    assert r.num_computed_tokens == 7 and len(r.block_table) == 2 and bm.num_free_blocks == 14


def test_rollback_frees_whole_blocks_only_the_rejected_tokens_used():
    bm = BlockManager(16, 4)
    s = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=100)
    r = decoding_with_draft(s, 5, 6)  # 6 known + 6 drafts: 12 tokens, 3 blocks
    assert len(r.block_table) == 3 and bm.num_free_blocks == 13
    third = r.block_table[2]
    s.rollback(r, 6)  # every draft rejected: 6 tokens fit in 2 blocks
    assert r.num_computed_tokens == 6 and len(r.block_table) == 2
    assert bm.num_free_blocks == 14 and bm.ref_counts[third] == 0 and third in bm.free_blocks
    s.rollback(r, 0)  # nothing rejected: nothing moves
    assert r.num_computed_tokens == 6 and len(r.block_table) == 2
    with pytest.raises(ValueError, match="cannot roll back"):
        s.rollback(r, 7)


def test_rollback_of_a_forked_sample_leaves_shared_blocks_to_its_sibling():
    bm = BlockManager(16, 4)
    s = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=100)
    leader = req(0, 8)  # two full blocks of prompt
    s.add(leader)
    advance(s.schedule())
    sib = Request("0-1", list(leader.prompt_token_ids), leader.params)
    assert s.fork(leader, sib) == []  # full blocks only: shared, nothing to copy
    shared = list(sib.block_table)
    assert all(bm.ref_counts[b] == 2 for b in shared)
    sib.output_token_ids.append(7)
    from specserve.types import Draft
    out = s.schedule({sib.request_id: Draft([1, 2, 3])})
    assert [x.request for x in out.scheduled] == [leader, sib]
    assert len(sib.block_table) == 3  # 9 known + 3 drafts: a private third block
    private = sib.block_table[2]
    s.rollback(sib, 4)  # back to 8 tokens: its private block goes, the shared ones stay
    assert sib.block_table == shared and bm.ref_counts[private] == 0
    assert all(bm.ref_counts[b] == 2 for b in shared)
    s.rollback(sib, 8)  # even all the way back, the leader keeps its blocks
    assert sib.block_table == [] and all(bm.ref_counts[b] == 1 for b in shared)
    assert leader.block_table[:2] == shared


def test_dropped_drafts_and_preemption_clear_the_draft():
    from specserve.types import Draft
    s = Scheduler(BlockManager(64, 4), max_num_seqs=8, max_num_batched_tokens=3)
    r = req(0, 2)
    s.add(r)
    advance(s.schedule())
    # 1 + 4 tokens > budget 3: the draft is dropped, the token stays
    out = s.schedule({r.request_id: Draft([1, 2, 3, 4])})
    assert out.scheduled[0].draft is None and out.scheduled[0].num_new_tokens == 1
    assert out.scheduled[0].num_draft_tokens == 0


def test_keep_rows_moves_a_tree_path_next_to_its_root_and_rolls_back_the_rest():
    """A verify span of 1 + 6 rows from position 5 (blocks of 4) keeps its root and the tree nodes at
    span rows 2 and 5: they move to positions 6 and 7; positions 8.. go, and the third block with them."""
    bm = BlockManager(num_blocks=16, block_size=4)
    s = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
    r = Request("r", list(range(6)), SamplingParams())
    bm.allocate(r.block_table, 12)
    r.num_computed_tokens = 12  # 5 context tokens, the root at 5, six tree rows at 6..11
    t = list(r.block_table)
    moves = s.keep_rows(r, 5, [0, 2, 5])
    # span row 2 (position 7: block 1, slot 3) -> position 6 (block 1, slot 2); row 5 (position 10:
    # block 2, slot 2) -> position 7 (block 1, slot 3)
    assert moves == [(t[1] * 4 + 3, t[1] * 4 + 2), (t[2] * 4 + 2, t[1] * 4 + 3)]
    assert r.num_computed_tokens == 8 and r.block_table == t[:2] and bm.num_free_blocks == 14
    # a chain's accepted prefix moves nothing
    assert s.keep_rows(r, 5, [0, 1]) == [] and r.num_computed_tokens == 7
    with pytest.raises(ValueError, match="cannot keep rows"):
        s.keep_rows(r, 5, [0, 2, 1])


def test_sarathi_decodes_first_then_one_chunk_of_prompt_within_the_prefill_budget():
    s = Scheduler(BlockManager(64, 4), max_num_seqs=8, max_num_batched_tokens=100, prefill_chunk=12)
    decs = [req(i, 3) for i in range(3)]
    for d in decs:
        s.add(d)
    advance(s.schedule())  # 9 prompt tokens: within the chunk
    long_ = req(9, 40)
    s.add(long_)
    out = s.schedule()
    # the three decodes (1 token each), then 12 - 3 = 9 prompt tokens
    assert [(x.request.request_id, x.num_new_tokens) for x in out.scheduled] == [("0", 1), ("1", 1), ("2", 1), ("9", 9)]
    advance(out)
    out = s.schedule()  # and again: the prompt moves one chunk a step beside the decodes
    assert [(x.request.request_id, x.num_new_tokens) for x in out.scheduled] == [("0", 1), ("1", 1), ("2", 1), ("9", 9)]
    # what a draft selection prices its rows on top of: the chunk the next step will carry
    advance(out)
    assert s.prompt_rows_next() == 9 == s.schedule().scheduled[-1].num_new_tokens
    s.running = [r for r in s.running if r.request_id != "9"]  # no prompt left: decodes only
    assert s.prompt_rows_next() == 0


def test_sarathi_prompts_move_by_at_least_a_block_when_decodes_fill_the_chunk():
    s = Scheduler(BlockManager(64, 4), max_num_seqs=8, max_num_batched_tokens=100, prefill_chunk=2)
    decs = [req(i, 1) for i in range(3)]
    for d in decs:
        s.add(d)
    out = s.schedule()
    assert [x.num_new_tokens for x in out.scheduled] == [1, 1, 1]  # a chunk of 2 is less than a block (4)
    advance(out)
    s.add(req(9, 10))
    out = s.schedule()
    # the decodes' 3 tokens exceed the chunk: the prompt still takes a block's worth
    assert [(x.request.request_id, x.num_new_tokens) for x in out.scheduled] == [("0", 1), ("1", 1), ("2", 1), ("9", 4)]


def test_without_a_chunk_whole_prompts_fill_the_step_budget():
    s = Scheduler(BlockManager(64, 4), max_num_seqs=8, max_num_batched_tokens=100)
    a = req(0, 3)
    s.add(a)
    advance(s.schedule())
    s.add(req(1, 60))
    assert [x.num_new_tokens for x in s.schedule().scheduled] == [1, 60]


def test_an_aborted_request_leaves_nothing_in_the_prefix_cache():
    """An abort may follow a step that failed midway: the tokens it scheduled were never computed."""
    bm = BlockManager(16, 4, enable_prefix_caching=True)
    s = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=100)
    a = req(0, 9)
    s.add(a)
    s.schedule()  # 9 tokens scheduled: 2 full blocks, then the step fails
    s.abort(a)
    assert bm.num_cached_blocks == 0
    b = req(1, 9)
    s.add(b)
    advance(s.schedule())
    s.finish(b)  # computed, finished: its 2 full blocks are offered
    assert bm.num_cached_blocks == 2


def test_a_prompt_being_scored_takes_from_the_prefix_cache_only_the_rows_it_has_scored():
    """prompt_logprobs needs each prompt row's logits: a cached row has none. A first admission computes
    the whole prompt; one coming back after preemption keeps the cached rows it scored already."""
    bm = BlockManager(16, 4, enable_prefix_caching=True)
    s = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=100)
    first = req(0, 13)
    s.add(first)
    advance(s.schedule())
    s.finish(first)  # its 3 full blocks (12 tokens) are cached
    scoring = Request("1", list(range(1, 14)), SamplingParams(max_tokens=4, prompt_logprobs=0), prompt_logprobs=[None])
    s.add(scoring)
    out = s.schedule()
    assert scoring.num_cached_tokens == 0 and out.scheduled[0].start == 0 and out.scheduled[0].num_new_tokens == 13
    s.abort(scoring)
    back = Request("2", list(range(1, 14)), SamplingParams(max_tokens=4, prompt_logprobs=0),
                   prompt_logprobs=[None] + [-1.0] * 9)  # tokens 1..9 scored: rows 0..8 done, row 9 on not
    s.add(back)
    out = s.schedule()
    assert out.scheduled[0].start == 8  # two cached blocks (8 rows <= 9), the third holds row 9
    plain = req(3, 13)
    s.add(plain)
    assert s.schedule().scheduled[-1].start == 12  # without scoring: every cached block
