"""The embedded SmolLM2-135M (Q4_1 GGUF) against HF transformers loading the same GGUF in float32."""
import importlib.util
import os

import pytest
import torch

from specserve import SamplingParams
from specserve.attention.paged import AttentionMetadata
from specserve.loading import embedded_model_path
from specserve_bench.humaneval import humaneval_prompts

transformers = pytest.importorskip("transformers")
if importlib.util.find_spec("accelerate") is None:
    pytest.skip("HF's GGUF loader needs accelerate", allow_module_level=True)


@pytest.fixture(scope="module")
def hf_model():
    path = embedded_model_path()
    return transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32).eval()


def stepwise_logits(llm, ids, n_decode):
    """Logits at every position: the first len-n_decode tokens as one prefill (dense path), then one
    token per step (the block-kernel path), all through the paged cache."""
    eng = llm.engine
    bs = eng.kv.block_size
    table: list[int] = []  # blocks of its own (others may hold the prefix cache's KV)
    eng.scheduler.blocks.allocate(table, len(ids))
    out, start = [], 0
    try:
        for n in [len(ids) - n_decode] + [1] * n_decode:
            meta = AttentionMetadata.build([n], [start + n], [table], bs, eng.device)
            out.append(eng.model.forward(torch.tensor(ids[start:start + n]), torch.arange(start, start + n), meta,
                                         eng.kv.k, eng.kv.v, torch.arange(n)))
            start += n
    finally:
        eng.scheduler.blocks.free(table)
    return torch.cat(out)


def test_logits_match_hf(embedded_llm, hf_model):
    for prompt in humaneval_prompts(3):
        ids = embedded_llm.tokenizer.encode(prompt)
        ours = stepwise_logits(embedded_llm, ids, n_decode=6)
        with torch.no_grad():
            ref = hf_model(torch.tensor([ids])).logits[0]
        assert (ours - ref).abs().max().item() <= 1e-3


def test_prompt_logprobs_match_hf(embedded_llm, hf_model):
    """SamplingParams.prompt_logprobs: each prompt token's log-probability and the top 3 at its position,
    against HF's log-softmax over the same prompt (a prompt that is also in the prefix cache: scored whole)."""
    for prompt in humaneval_prompts(2):
        embedded_llm.generate(prompt, SamplingParams(temperature=0, max_tokens=1))  # now in the prefix cache
        out = embedded_llm.generate(prompt, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=3))[0]
        ids = out.prompt_token_ids
        with torch.no_grad():
            ref = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0, :-1].float(), dim=-1)  # [P-1, vocab]
        want = ref[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
        assert out.num_cached_tokens == 0 and out.prompt_logprobs[0] is None and out.prompt_top_logprobs[0] is None
        assert (torch.tensor(out.prompt_logprobs[1:]) - want).abs().max().item() <= 1e-3
        vals, top = ref.topk(3, dim=-1)
        for i, got in enumerate(out.prompt_top_logprobs[1:]):
            assert set(got) == set(top[i].tolist()) or vals[i, 2] - ref[i].topk(4).values[3] < 1e-3  # a near tie
            assert max(abs(got[t] - ref[i, t].item()) for t in got) <= 1e-3


def test_greedy_matches_hf_generate(embedded_llm, hf_model):
    prompts = humaneval_prompts(4)
    outs = embedded_llm.generate(prompts, SamplingParams(temperature=0, max_tokens=48))
    for prompt, out in zip(prompts, outs):
        ids = embedded_llm.tokenizer.encode(prompt)
        with torch.no_grad():
            ref = hf_model.generate(torch.tensor([ids]), max_new_tokens=48, do_sample=False)[0, len(ids):].tolist()
        assert out.outputs[0].token_ids == ref


class OpenAIPenalties(transformers.LogitsProcessor):
    """OpenAI's presence and frequency penalties over the generated tokens only (the reference)."""

    def __init__(self, prompt_len: int, presence: float, frequency: float):
        self.prompt_len, self.presence, self.frequency = prompt_len, presence, frequency

    def __call__(self, input_ids, scores):
        counts = torch.zeros_like(scores)
        counts.scatter_add_(1, input_ids[:, self.prompt_len:], torch.ones_like(input_ids[:, self.prompt_len:], dtype=scores.dtype))
        return scores - self.frequency * counts - self.presence * (counts > 0).to(scores.dtype)


# presence and frequency (17 s) in make test-all only: their formula is unit-tested per token, and the
# e2e tests run them through the engine under speculation
@pytest.mark.parametrize("penalties", [dict(repetition_penalty=1.3),
                                       pytest.param(dict(presence_penalty=0.6, frequency_penalty=0.4), marks=pytest.mark.full)])
def test_penalised_greedy_matches_hf_generate(embedded_llm, hf_model, penalties):
    """repetition_penalty against HF's own RepetitionPenaltyLogitsProcessor (prompt and output counted),
    presence and frequency against the formula over the output's tokens."""
    prompts = humaneval_prompts(3)
    outs = embedded_llm.generate(prompts, SamplingParams(temperature=0, max_tokens=40, **penalties))
    plain = embedded_llm.generate(prompts, SamplingParams(temperature=0, max_tokens=40))
    for prompt, out, unpenalised in zip(prompts, outs, plain):
        assert out.outputs[0].token_ids != unpenalised.outputs[0].token_ids  # the penalties change the answer
        ids = embedded_llm.tokenizer.encode(prompt)
        kw = dict(repetition_penalty=penalties["repetition_penalty"]) if "repetition_penalty" in penalties else dict(
            logits_processor=transformers.LogitsProcessorList([OpenAIPenalties(len(ids), 0.6, 0.4)]))
        with torch.no_grad():
            ref = hf_model.generate(torch.tensor([ids]), max_new_tokens=40, do_sample=False, **kw)[0, len(ids):].tolist()
        assert out.outputs[0].token_ids == ref
