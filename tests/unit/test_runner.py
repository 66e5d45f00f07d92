import torch

from specserve.engine.runner import ModelRunner
from specserve.scheduler.scheduler import ScheduledRequest
from specserve.types import Request, SamplingParams


def test_runner_takes_each_steps_tokens_across_prompt_and_output():
    """The runner slices prompt and output separately; every split point must give the same tokens."""
    class Capture:
        def forward(self, token_ids, *rest):
            self.ids = token_ids.tolist()
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
