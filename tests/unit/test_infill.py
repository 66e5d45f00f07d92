"""Fill-in-the-middle prompts (loading/infill.py): the FIM ids found as llama.cpp finds them, and the
prompt laid out as llama.cpp's format_prompt_infill lays it out (a transcription of its C++ below
is the reference), on a toy vocabulary whose encode is one id per character."""
import pytest

from specserve.loading.infill import FimTokens, find_fim_tokens, infill_ids

QWEN = {"<|fim_prefix|>": 10, "<|fim_middle|>": 11, "<|fim_suffix|>": 12, "<|fim_pad|>": 13,
        "<|repo_name|>": 14, "<|file_sep|>": 15, "<|endoftext|>": 16}


def encode(text: str) -> list[int]:
    return [1000 + ord(c) for c in text]


def test_the_ids_come_from_the_header_first_then_from_the_vocabulary_by_text():
    assert find_fim_tokens(QWEN) == FimTokens(pre=10, suf=12, mid=11, pad=13, rep=14, sep=15)
    # the header's ids win; the older key names count too
    got = find_fim_tokens(QWEN, {"tokenizer.ggml.fim_pre_token_id": 1, "tokenizer.ggml.suffix_token_id": 2,
                                 "tokenizer.ggml.fim_mid_token_id": None})
    assert (got.pre, got.suf, got.mid) == (1, 2, 11)
    # StarCoder's spelling and CodeLlama's; none in a chat model's vocabulary
    assert find_fim_tokens({"<fim_prefix>": 1, "<fim_suffix>": 2, "<fim_middle>": 3, "<fim_pad>": 4}).can_infill
    assert find_fim_tokens({"▁<PRE>": 5, "▁<SUF>": 6, "▁<MID>": 7}).can_infill
    none = find_fim_tokens({"<|im_start|>": 1, "<|im_end|>": 2, "<reponame>": 3})
    assert not none.can_infill and none.missing() == ["pre", "suf", "mid"] and none.ends() == [3]
    with pytest.raises(ValueError, match="no fill-in-the-middle tokens .*pre, suf, mid"):
        infill_ids(none, encode, "a", "b")


def format_prompt_infill(fim, prefix, suffix, extra_chunks, n_batch, n_predict, n_ctx, prompt, bos=None):
    """llama.cpp's tools/server/server-common.cpp format_prompt_infill, line for line (spm_infill off)."""
    extra_tokens = []
    tokens_prefix, tokens_suffix, tokens_prompt = encode(prefix), encode(suffix), encode(prompt)
    if fim.rep is not None:
        extra_tokens += [fim.rep] + encode("myproject\n")
    for chunk in extra_chunks:
        if fim.sep is not None:
            extra_tokens += [fim.sep] + encode(chunk["filename"] + "\n")
        else:
            extra_tokens += encode("\n\n--- snippet ---\n\n")
        extra_tokens += encode(chunk["text"])
    if fim.sep is not None:
        extra_tokens += [fim.sep] + encode("filename\n")
    n_prefix_take = min(len(tokens_prefix), 3 * (n_batch // 4))
    n_suffix_take = min(len(tokens_suffix), max(0, (n_batch // 4) - (2 + len(tokens_prompt))))
    n_extra_take = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_tokens))
    tokens_prefix = tokens_prefix[len(tokens_prefix) - n_prefix_take:]
    tokens_suffix = tokens_suffix[:n_suffix_take]
    tokens_prefix = [fim.pre] + tokens_prefix + tokens_prompt
    tokens_suffix = [fim.suf] + tokens_suffix
    embd_inp = ([bos] if bos is not None else []) + tokens_prefix
    embd_inp = extra_tokens[len(extra_tokens) - n_extra_take:] + embd_inp
    return embd_inp + tokens_suffix + [fim.mid]


def test_a_plain_fim_prompt_is_prefix_suffix_middle():
    fim = find_fim_tokens(QWEN)
    assert infill_ids(fim, encode, "ab", "c") == [10, 1097, 1098, 12, 1099, 11]
    assert infill_ids(fim, encode, "", "", bos=7) == [7, 10, 12, 11]


@pytest.mark.parametrize("vocab", [QWEN, {k: v for k, v in QWEN.items() if k != "<|file_sep|>"},
                                   {k: v for k, v in QWEN.items() if k != "<|repo_name|>"}])
@pytest.mark.parametrize("n_batch,n_ctx,n_predict", [(2048, 8192, 64), (16, 200, 10), (16, 40, 4), (8, 8, 0)])
def test_the_repository_layout_and_its_limits_are_llama_cpps(vocab, n_batch, n_ctx, n_predict):
    fim = find_fim_tokens(vocab)
    files = [{"filename": "util.py", "text": "def f():\n    pass\n"}, {"filename": "", "text": "x = 1\n"}]
    for prefix, suffix, prompt in (("import os\n\ndef main():\n    ", "\n\nmain()\n", "pri"), ("", "", ""),
                                   ("p" * 40, "s" * 40, "q" * 3)):
        want = format_prompt_infill(fim, prefix, suffix, files, n_batch, n_predict, n_ctx, prompt, bos=5)
        got = infill_ids(fim, encode, prefix, suffix, bos=5, prompt=prompt,
                         files=[(f["filename"], f["text"]) for f in files], n_batch=n_batch, n_ctx=n_ctx,
                         n_predict=n_predict)
        assert got == want
    # no files: the project and the file line only (llama.cpp's /infill adds them always)
    got = infill_ids(fim, encode, "a", "b", files=[], n_batch=2048, n_ctx=8192)
    assert got == format_prompt_infill(fim, "a", "b", [], 2048, 0, 8192, "")
