from specserve.kv.block_manager import BlockManager
from specserve.scheduler.scheduler import Scheduler
from specserve.types import Request, RequestStatus, SamplingParams


def req(i, n_prompt):
    return Request(str(i), list(range(1, n_prompt + 1)), SamplingParams(max_tokens=4))


def advance(out):
    sampling = [s.samples for s in out.scheduled]  # decided before the computed count moves
    for s, samples in zip(out.scheduled, sampling):
        s.request.num_computed_tokens += s.num_new_tokens
        if samples:
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

