import torch

from specserve.engine.runner import ModelRunner
from specserve.scheduler.scheduler import ScheduledRequest
from specserve.types import Request, SamplingParams


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
            r.num_computed_tokens = start
            runner.execute([ScheduledRequest(r, n)])
            assert model.ids == r.all_token_ids[start:start + n], (start, n)


def test_runner_appends_drafts_and_asks_logits_for_every_span_row():
    class Capture:
        def forward(self, token_ids, positions, meta, k, v, logits_rows, return_hidden=False):
            self.ids, self.pos, self.rows, self.q = token_ids.tolist(), positions.tolist(), logits_rows.tolist(), meta.q_lens
            return torch.zeros(1, 1)

    kv = type("KV", (), {"block_size": 4, "k": None, "v": None})()
    model = Capture()
    runner = ModelRunner(model, kv, torch.device("cpu"))
    a = Request("a", [10, 11, 12], SamplingParams())
    a.output_token_ids, a.num_computed_tokens, a.block_table = [20], 3, [0, 1]
    a.draft_token_ids = [30, 31, 32]
    b = Request("b", [40, 41], SamplingParams())
    b.output_token_ids, b.num_computed_tokens, b.block_table = [50], 2, [2]
    runner.execute([ScheduledRequest(a, 4), ScheduledRequest(b, 1)])
    assert model.ids == [20, 30, 31, 32, 50]
    assert model.pos == [3, 4, 5, 6, 2]
    assert model.q == [4, 1]
    assert model.rows == [0, 1, 2, 3, 4]  # a: after 20, 30, 31, 32; b: after 50
