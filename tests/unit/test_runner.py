import torch

from specserve.engine.runner import ModelRunner
from specserve.scheduler.scheduler import ScheduledRequest
from specserve.types import Draft, Request, SamplingParams


def test_runner_takes_each_steps_tokens_across_prompt_and_output():
    """The runner slices prompt and output separately; every split point must give the same tokens."""
    class Capture:
        def forward(self, token_ids, positions, meta, k, v, logits_rows, return_hidden=False):
            self.ids, self.rows = token_ids.tolist(), logits_rows.tolist()
            return torch.zeros(1, 1)

    kv = type("KV", (), {"block_size": 4, "k": None, "v": None})()
    model = Capture()
    runner = ModelRunner(model, kv, torch.device("cpu"))
    r = Request("0", [10, 11, 12, 13, 14], SamplingParams())
    r.output_token_ids = [20, 21, 22]  # e.g. recomputing after preemption
    r.block_table = [0, 1]
    for start in range(8):
        for n in range(1, 9 - start):
            out = runner.execute([ScheduledRequest(r, start, n, samples=start + n == r.num_tokens)])
            assert model.ids == r.all_token_ids[start:start + n], (start, n)
            assert out.rows[0].tokens == slice(0, n)
            assert out.rows[0].logits == (slice(0, 1) if start + n == r.num_tokens else None)


def test_runner_appends_drafts_and_asks_logits_for_every_span_row():
    class Capture:
        def forward(self, token_ids, positions, meta, k, v, logits_rows, return_hidden=False):
            self.ids, self.pos, self.rows, self.q = token_ids.tolist(), positions.tolist(), logits_rows.tolist(), meta.q_lens
            return torch.zeros(len(self.rows), 1)

    kv = type("KV", (), {"block_size": 4, "k": None, "v": None})()
    model = Capture()
    runner = ModelRunner(model, kv, torch.device("cpu"))
    a = Request("a", [10, 11, 12], SamplingParams())
    a.output_token_ids, a.block_table = [20], [0, 1]
    b = Request("b", [40, 41], SamplingParams())
    b.output_token_ids, b.block_table = [50], [2]
    c = Request("c", [60, 61, 62, 63, 64], SamplingParams())  # a prompt chunk short of its end
    c.block_table = [3, 4]
    out = runner.execute([ScheduledRequest(a, 3, 4, Draft([30, 31, 32])), ScheduledRequest(c, 0, 3, samples=False),
                          ScheduledRequest(b, 2, 1)])
    assert model.ids == [20, 30, 31, 32, 60, 61, 62, 50]
    assert model.pos == [3, 4, 5, 6, 0, 1, 2, 2]
    assert model.q == [4, 3, 1]
    assert model.rows == [0, 1, 2, 3, 7]  # a: after 20, 30, 31, 32; c: none; b: after 50
    # the typed layout: who owns which rows, so nobody downstream re-derives it
    assert [r.tokens for r in out.rows] == [slice(0, 4), slice(4, 7), slice(7, 8)]
    assert [r.logits for r in out.rows] == [slice(0, 4), None, slice(4, 5)]
    assert out.logits.shape[0] == 5


def test_runner_puts_a_tree_after_fast_forwarded_tokens():
    """Grammar-forced tokens appended without a pass are computed in the next span before its draft:
    known tokens as a chain (each attends to those before it), the tree hanging from the last one."""
    class Capture:
        def forward(self, token_ids, positions, meta, k, v, logits_rows, return_hidden=False):
            self.ids, self.pos, self.rows = token_ids.tolist(), positions.tolist(), logits_rows.tolist()
            self.parents = meta.span_parents
            return torch.zeros(len(self.rows), 1)

    kv = type("KV", (), {"block_size": 4, "k": None, "v": None})()
    model = Capture()
    runner = ModelRunner(model, kv, torch.device("cpu"))
    a = Request("a", [10, 11], SamplingParams())
    a.output_token_ids, a.block_table = [20, 21, 22], [0, 1, 2]  # 20 sampled, 21 and 22 forced: 2 computed
    tree = Draft([30, 31, 32], parents=[-1, -1, 0])  # 30 and 31 after 22, 32 after 30
    out = runner.execute([ScheduledRequest(a, 2, 6, tree)])
    assert model.ids == [20, 21, 22, 30, 31, 32]
    assert model.pos == [2, 3, 4, 5, 5, 6]
    assert model.parents == [[-1, 0, 1, 2, 2, 3]]
    assert model.rows == [2, 3, 4, 5]  # the root (22), then each node
    assert out.rows[0].logits == slice(0, 4)
