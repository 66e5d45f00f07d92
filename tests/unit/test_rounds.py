"""cuda/rounds.py on CPU (round bodies uncaptured, torch's ops): a run of regular-decoding rounds and the
run queued after it give the eager runner's greedy tokens step by step, and a sequence marked dead in
the queued run writes nothing into the KV cache."""
from types import SimpleNamespace

import pytest
import torch

from specserve.cuda.rounds import DeviceRounds, RoundsInput
from specserve.engine.graph_runner import GraphModelRunner
from specserve.engine.rounds import RoundsDriver
from specserve.engine.runner import ModelRunner
from specserve.kv.cache import KVCache
from specserve.scheduler.scheduler import ScheduledRequest
from specserve.types import Request, SamplingParams

from .test_static_step import CPU, _model

BS = 4
TABLES = {"a": [0, 1, 2, 3, 4], "b": [5, 6, 7, 8, 9], "c": [10, 11, 12, 13, 14]}
PROMPTS = {"a": [1, 2, 3, 4, 5, 6], "b": [7, 8, 9, 10, 11], "c": [12, 13, 14, 15]}


def _prefill(model, kv):
    """The three prompts computed by the eager runner, each with its greedy first token appended."""
    eager = ModelRunner(model, kv, CPU, attention="pad")
    reqs = []
    for rid, prompt in PROMPTS.items():
        r = Request(rid, list(prompt), SamplingParams(temperature=0))
        r.block_table = list(TABLES[rid])
        reqs.append(r)
    out = eager.execute([ScheduledRequest(r, 0, len(r.prompt_token_ids)) for r in reqs])
    for r, (_, rows) in zip(reqs, out):
        r.output_token_ids.append(int(out.logits[rows.logits].argmax(-1)[-1]))
    return eager, reqs


def _reference(model, n: int) -> dict[str, list[int]]:
    """Greedy decoding, one eager step at a time: each request's next n tokens."""
    kv = KVCache(2, 15, BS, 2, 16, torch.float32, CPU)
    eager, reqs = _prefill(model, kv)
    got = {r.request_id: [] for r in reqs}
    for _ in range(n):
        out = eager.execute([ScheduledRequest(r, r.num_tokens - 1, 1) for r in reqs])
        for r, (_, rows) in zip(reqs, out):
            tok = int(out.logits[rows.logits].argmax(-1)[0])
            r.output_token_ids.append(tok)
            got[r.request_id].append(tok)
    return got


def test_queued_runs_continue_regular_decoding_and_dead_rows_write_nothing():
    model = _model()
    ref = _reference(model, 5)
    kv = KVCache(2, 15, BS, 2, 16, torch.float32, CPU)
    _, reqs = _prefill(model, kv)
    runner = GraphModelRunner(model, kv, CPU, "pad", max_seqs=4, max_model_len=20, max_graph_tokens=16, use_triton=False)
    rounds = DeviceRounds(runner, None, max_rounds=4, max_seqs=4)
    seqs = [RoundsInput(r.num_tokens - 1, r.output_token_ids[-1], r.block_table) for r in reqs]
    first = rounds.launch(seqs, 3)
    out1 = rounds.collect(first)
    assert out1.counts == [[1, 1, 1]] * 3
    assert out1.tokens == [ref[r.request_id][:3] for r in reqs]
    # b stops: the run queued after the first goes on from the device's state for a and c only
    b_slots = torch.tensor([TABLES["b"][p // BS] * BS + p % BS for p in range(len(PROMPTS["b"]) + 3, 20)])
    k_before, v_before = kv.k[:, b_slots].clone(), kv.v[:, b_slots].clone()
    second = rounds.extend(first, 2, [r.block_table for r in reqs], None, [True, False, True])
    out2 = rounds.collect(second)
    assert out2.tokens[0] == ref["a"][3:5] and out2.tokens[2] == ref["c"][3:5]
    assert torch.equal(kv.k[:, b_slots], k_before) and torch.equal(kv.v[:, b_slots], v_before)
    assert rounds.rounds == 3 * 3 + 2 * 2 and rounds.drafted == 0  # the dead row's rounds are not counted


def _sizer(K: int, M: int, rounds: int = 0, accepted: int = 0):
    """engine/rounds.RoundsDriver's run sizing over stand-ins of its device rounds and engine."""
    dev = SimpleNamespace(K=K, R=K + 1, M=M, rounds=rounds, accepted=accepted)
    return RoundsDriver(dev), SimpleNamespace(max_model_len=1000)


def _req(max_tokens: int, done: int):
    return SimpleNamespace(params=SimpleNamespace(max_tokens=max_tokens), output_token_ids=[0] * done)


def test_runs_are_sized_by_the_tokens_a_round_measured():
    """Regular decoding: exactly the tokens left, past the queued rounds. With drafts: the rounds the
    request with the most left needs at the measured rate (2 tokens a round here), the queued rounds
    counted at that rate too, so no run is queued that the queued ones should make useless."""
    drv, eng = _sizer(K=0, M=16)
    assert drv._num_rounds(eng, [_req(20, 15)], [100], 0) == 5
    assert drv._num_rounds(eng, [_req(20, 15)], [100], 3) == 2
    assert drv._num_rounds(eng, [_req(20, 15)], [100], 5) == 0
    drv, eng = _sizer(K=3, M=16, rounds=40, accepted=40)  # 2 tokens a round
    assert drv._num_rounds(eng, [_req(100, 80), _req(100, 70)], [100, 100], 0) == 15
    assert drv._num_rounds(eng, [_req(100, 80), _req(100, 70)], [100, 100], 10) == 5
    assert drv._num_rounds(eng, [_req(100, 80)], [100], 10) == 0
    assert drv._num_rounds(eng, [_req(100, 0)], [100], 0) == 16  # M
    assert drv._num_rounds(eng, [_req(100, 0)], [999 - 4 * 7], 0) == 7  # room for 7 rounds of R = 4 rows
    drv, eng = _sizer(K=3, M=16)  # nothing measured yet: 1 + K / 2 tokens a round
    assert drv._num_rounds(eng, [_req(100, 75)], [100], 0) == 10


def test_a_tree_past_the_buffers_is_refused_with_what_to_change():
    runner = GraphModelRunner(_model(), KVCache(2, 15, BS, 2, 16, torch.float32, CPU), CPU, "pad", max_seqs=4,
                              max_model_len=64, max_graph_tokens=32, use_triton=False)
    with pytest.raises(ValueError, match="cuda-rounds 0"):
        DeviceRounds(runner, object(), draft_len=4, beam=8, top_k=8)  # 1 + 32 verify rows > the 32 captured
