"""The Python API refuses what it would otherwise misread (issue 36): prompts that are neither a string
nor token ids, non-bool flags; and logit_bias stays lossless under speculative decoding (greedy output
token-identical to regular decoding with the same bias)."""
import pytest

from specserve import LLM, SamplingParams
from specserve.sampling.bad_words import bad_word_forms


@pytest.mark.parametrize("prompts, words", [(None, "NoneType"), (5, "int"), (b"hi", "bytes"), ([b"a"], "bytes"),
                                            (["ok", 3.5], "float"), ([[1, "2"]], "str"), ([True, False], "bool")])
def test_prompts_of_the_wrong_type_are_refused_with_a_message(embedded_llm, prompts, words):
    with pytest.raises(TypeError, match="prompt") as e:
        embedded_llm.generate(prompts, SamplingParams(max_tokens=1))
    assert words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("field", ["ignore_eos", "skip_special_tokens"])
def test_flags_must_be_bools(field):
    with pytest.raises(ValueError, match=f"{field} must be True or False"):
        SamplingParams(**{field: "no"})


@pytest.mark.parametrize("bias", [{-1: 1.0}, {1: 100.5}, {1: float("nan")}, {"1": 1.0}, [(1, 1.0)]])
def test_bad_logit_bias_is_refused(bias):
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias=bias)


@pytest.mark.parametrize("method", ["lookup", "draft"])
def test_logit_bias_is_lossless_under_speculation(embedded_llm, method):
    """The bias is added to every row of a verify span, so drafts are checked against the biased
    distribution: greedy output equals regular decoding's with the bias, and drafts were accepted
    (the EAGLE draft knows nothing of the bias: its drafts of banned tokens are rejected)."""
    prompt = "def fibonacci(n):\n    "
    plain = embedded_llm.generate(prompt, SamplingParams(temperature=0, max_tokens=40))[0].outputs[0].token_ids
    banned = sorted(set(plain[:6]))  # steer away from the unbiased answer's first tokens
    greedy = SamplingParams(temperature=0, max_tokens=40, logit_bias={t: -100.0 for t in banned})
    want = embedded_llm.generate(prompt, greedy)[0].outputs[0].token_ids
    assert want != plain and not set(want) & set(banned)
    spec = LLM(speculative=dict(method=method, fallback=False), kv_cache_gib=0.25)
    got = spec.generate(prompt, greedy)[0].outputs[0]
    assert got.token_ids == want
    assert spec.spec_stats()["accepted"] > 0


PENALTIES = dict(repetition_penalty=1.3, presence_penalty=0.6, frequency_penalty=0.4)


@pytest.mark.parametrize("spec", [dict(method="lookup+draft"), dict(method="draft", policy="bass", shape="tree")],
                         ids=["lookup+draft-chain", "eagle-tree"])
def test_penalties_are_lossless_under_speculation(embedded_llm, spec):
    """Each row of a verify span is penalised for the draft tokens on its path (a tree's rows for their
    own branch): greedy output with penalties equals regular decoding's with them, in a batch of three,
    and drafts were accepted."""
    prompts = ["def fibonacci(n):\n    ", "Write a short poem about the sea.\n", "import numpy as np\n\ndef mean(xs):\n"]
    plain = [o.outputs[0].token_ids for o in embedded_llm.generate(prompts, SamplingParams(temperature=0, max_tokens=40))]
    greedy = SamplingParams(temperature=0, max_tokens=40, **PENALTIES)
    want = [o.outputs[0].token_ids for o in embedded_llm.generate(prompts, greedy)]
    assert all(w != p for w, p in zip(want, plain))  # the penalties changed every answer
    llm = LLM(speculative=dict(spec, fallback=False), kv_cache_gib=0.25)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)] == want
    assert llm.spec_stats()["accepted"] > 0


def test_min_tokens_allowed_ids_and_stop_strings_as_vllm_and_lossless_under_speculation(embedded_llm):
    """min_tokens holds EOS back (in a verify span, by each row's depth); allowed_token_ids keeps every
    token in the set; include_stop_str_in_output keeps the stop string. Speculation gives the same tokens."""
    chat = embedded_llm.tokenizer.apply_chat_template([{"role": "user", "content": "Say hi."}], add_generation_prompt=True)
    short = embedded_llm.generate(chat, SamplingParams(temperature=0, max_tokens=64))[0].outputs[0]
    assert short.finish_reason == "stop" and len(short.token_ids) < 32  # it ends by EOS early...
    held = SamplingParams(temperature=0, max_tokens=64, min_tokens=32)
    want = embedded_llm.generate(chat, held)[0].outputs[0]
    eos = set(embedded_llm.tokenizer.eos_token_ids)
    assert len(want.token_ids) >= 32 and not eos & set(want.token_ids[:32])  # ...unless held back
    assert want.token_ids[:len(short.token_ids) - 1] == short.token_ids[:-1]  # the same answer up to the EOS it would end on
    code = "def fibonacci(n):\n    "
    allowed = sorted(set(embedded_llm.generate(code, SamplingParams(temperature=0, max_tokens=40))[0].outputs[0].token_ids))[::2]
    kept = SamplingParams(temperature=0, max_tokens=30, allowed_token_ids=allowed)
    want_allowed = embedded_llm.generate(code, kept)[0].outputs[0].token_ids
    assert set(want_allowed) <= set(allowed)
    llm = LLM(speculative=dict(method="lookup+draft", fallback=False), kv_cache_gib=0.25)
    assert llm.generate(chat, held)[0].outputs[0].token_ids == want.token_ids
    assert llm.generate(code, kept)[0].outputs[0].token_ids == want_allowed
    assert llm.spec_stats()["accepted"] > 0
    stop = SamplingParams(temperature=0, max_tokens=40, stop=["\n"])
    cut, kept_stop = (embedded_llm.generate(code, SamplingParams(**{**vars(stop), "include_stop_str_in_output": k}))[0].outputs[0]
                      for k in (False, True))
    assert cut.token_ids == kept_stop.token_ids and kept_stop.text == cut.text + "\n"


def test_bad_words_as_vllm_and_lossless_under_speculation(embedded_llm):
    """Each word's forms (as written, and after a space) never complete in the output, the answers
    change where the word was, and speculation gives the same tokens (each verify row banned for the
    draft tokens on its path)."""
    prompts = ["def fibonacci(n):\n    ", "Write a short poem about the sea.\n", "import numpy as np\n\ndef mean(xs):\n"]
    words = ["return", "clear", "np"]  # one in each answer
    plain = [o.outputs[0] for o in embedded_llm.generate(prompts, SamplingParams(temperature=0, max_tokens=40))]
    assert all(w in o.text for w, o in zip(words, plain))
    greedy = SamplingParams(temperature=0, max_tokens=40, bad_words=words)
    want = [o.outputs[0].token_ids for o in embedded_llm.generate(prompts, greedy)]
    assert all(w != p.token_ids for w, p in zip(want, plain))
    forms = bad_word_forms(words, lambda t: embedded_llm.tokenizer.encode(t, add_special_tokens=False))
    assert len(forms) == 6  # each word as written and after a space
    for ids in want:
        assert not any(ids[i:i + len(f)] == list(f) for f in forms for i in range(len(ids)))
    llm = LLM(speculative=dict(method="lookup+draft", fallback=False), kv_cache_gib=0.25)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)] == want
    assert llm.spec_stats()["accepted"] > 0


def test_allowed_tokens_that_are_all_bad_words_are_refused(embedded_llm):
    forms = bad_word_forms(["hi"], lambda t: embedded_llm.tokenizer.encode(t, add_special_tokens=False))
    assert all(len(f) == 1 for f in forms)
    with pytest.raises(ValueError, match="every allowed token is a bad word"):
        embedded_llm.generate("x", SamplingParams(max_tokens=2, bad_words=["hi"], allowed_token_ids=[f[0] for f in forms]))


def test_truncate_prompt_tokens_serves_the_prompts_last_tokens(embedded_llm):
    """vLLM's truncate_prompt_tokens: the answer to the last k tokens, reported as the prompt; -1 keeps
    what the context has room for, where the whole prompt would be refused."""
    ids = embedded_llm.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 6)
    greedy = dict(temperature=0, max_tokens=8)
    got = embedded_llm.generate([ids], SamplingParams(**greedy, truncate_prompt_tokens=12))[0]
    want = embedded_llm.generate([ids[-12:]], SamplingParams(**greedy))[0]
    assert got.prompt_token_ids == ids[-12:] and got.outputs[0].token_ids == want.outputs[0].token_ids
    short = LLM(max_model_len=32, kv_cache_gib=0.05)
    assert len(ids) > 32
    with pytest.raises(ValueError, match="context is 32"):
        short.generate([ids], SamplingParams(**greedy))
    with pytest.raises(ValueError, match="truncate_prompt_tokens .33. must be at most the model's context .32."):
        short.generate([ids], SamplingParams(**greedy, truncate_prompt_tokens=33))
    out = short.generate([ids], SamplingParams(**greedy, truncate_prompt_tokens=-1))[0]
    assert out.prompt_token_ids == ids[-31:] and len(out.outputs[0].token_ids) == 1  # the context's last slot


@pytest.mark.parametrize("kw, words", [
    (dict(min_tokens=2, allowed_token_ids=[2]), "some allowed token must be one that does not end"),  # 2: SmolLM2's EOS
    (dict(stop_token_ids=[49152]), "stop_token_ids: token id 49152 is not in the vocabulary"),
    (dict(allowed_token_ids=[49152]), "allowed_token_ids: token id 49152"),
    (dict(allowed_token_ids=[5], guided_choice=["yes"]), "allowed_token_ids cannot be combined with guided"),
    (dict(bad_words=["ok"], guided_choice=["yes"]), "bad_words cannot be combined with guided"),
])
def test_sampling_fields_that_would_leave_nothing_to_sample_are_refused(embedded_llm, kw, words):
    """A row with every token ruled out (or an id past the vocabulary) would sample garbage or fail the
    whole batch: refused before anything is queued, in one line."""
    with pytest.raises(ValueError, match=words):
        embedded_llm.generate("hi", SamplingParams(max_tokens=4, **kw))
