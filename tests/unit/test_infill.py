"""Fill-in-the-middle prompts: the FIM ids found as llama.cpp finds them (loading/infill.py), and
/infill's prompt laid out as llama.cpp's format_prompt_infill lays it out (server/routes/infill.py; a
transcription of its C++ below is the reference), on a toy tokenizer whose encode is one id per
character; llama-server's indentation and time stops on the text."""
import pytest

from specserve.loading.infill import FimTokens, find_fim_tokens, frame

pytest.importorskip("fastapi")
from specserve.server.routes.infill import Stops, nested, repository_prompt, request_fields  # noqa: E402
from specserve.server.routes.translated import RequestError  # noqa: E402

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
        frame(none, [1], [2])


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


class Toy:
    """A Tokenizer's surface repository_prompt reads: one id per character."""
    bos_token_id, add_bos = 5, True

    def __init__(self, vocab):
        self.fim = find_fim_tokens(vocab)

    def encode_text(self, text):
        return encode(text)

    def encode(self, text, add_special_tokens=True):
        return encode(text)


def test_a_plain_fim_prompt_is_prefix_suffix_middle():
    fim = find_fim_tokens(QWEN)
    assert frame(fim, encode("ab"), encode("c")) == [10, 1097, 1098, 12, 1099, 11]
    assert frame(fim, [], [], bos=7) == [7, 10, 12, 11]


@pytest.mark.parametrize("vocab", [QWEN, {k: v for k, v in QWEN.items() if k != "<|file_sep|>"},
                                   {k: v for k, v in QWEN.items() if k != "<|repo_name|>"}])
@pytest.mark.parametrize("n_batch,n_ctx,n_predict", [(2048, 8192, 64), (16, 200, 10), (16, 40, 4), (8, 8, 0)])
def test_the_repository_layout_and_its_limits_are_llama_cpps(vocab, n_batch, n_ctx, n_predict):
    tok = Toy(vocab)
    files = [{"filename": "util.py", "text": "def f():\n    pass\n"}, {"filename": "", "text": "x = 1\n"}]
    for prefix, suffix, prompt in (("import os\n\ndef main():\n    ", "\n\nmain()\n", "pri"), ("", "", ""),
                                   ("p" * 40, "s" * 40, "q" * 3)):
        want = format_prompt_infill(tok.fim, prefix, suffix, files, n_batch, n_predict, n_ctx, prompt, bos=5)
        got = repository_prompt(tok, prefix, suffix, prompt, [(f["filename"], f["text"]) for f in files],
                                n_batch=n_batch, n_ctx=n_ctx, room=2 * n_predict)
        assert got == want
    # no files: the project and the file line only (llama.cpp's /infill adds them always)
    assert repository_prompt(tok, "a", "b", n_ctx=8192) == format_prompt_infill(tok.fim, "a", "b", [], 2048, 0, 8192, "", bos=5)


def server_stops(text_pieces, n_indent=0, t_max_ms=0, times=None):
    """llama-server's process_token on these tokens' texts (server-context.cpp), line for line: the
    text sent and whether it stopped."""
    generated, last_nl_pos, has_new_line = "", 0, False
    for i, piece in enumerate(text_pieces):
        generated += piece
        if has_new_line and n_indent > 0:
            if last_nl_pos > 0:
                pos = last_nl_pos
                while pos < len(generated) and generated[pos] in " \t":
                    pos += 1
                if pos < len(generated) and pos - last_nl_pos < n_indent:
                    return generated[:pos], True
            nl = generated.find("\n", last_nl_pos)
            if nl >= 0:
                last_nl_pos = nl + 1
        if "\n" in piece:
            has_new_line = True
            if t_max_ms > 0 and times[i] * 1e3 > t_max_ms:
                return generated, True
    return generated, False


@pytest.mark.parametrize("pieces", [
    ["    if x:", "\n", "        ", "return 1", "\n", "    ", "return 2", "\n", "x", " = 3"],
    ["a", "\n", "\n", "b"],  # an empty line is indented less
    ["  ", "x", "\n", "  ", "  ", "y", "\n", " ", "z"],
    ["one line only"],
])
@pytest.mark.parametrize("n_indent", [0, 1, 4, 8])
def test_the_indentation_and_time_stops_are_llama_servers(pieces, n_indent):
    """Token by token (the engine's one-token steps), the middle and the stop are llama-server's (a
    streamed middle cannot take back what it sent: the whole response's is the cut one)."""
    times = [0.1 * i for i in range(len(pieces))]
    for t_max_ms in (0, 150):
        want = server_stops(pieces, n_indent, t_max_ms, times)
        stops = Stops({"n_indent": n_indent, "t_max_predict_ms": t_max_ms})
        ended = False
        for piece, t in zip(pieces, times):
            _, ended = stops.cut(piece, t)
            if ended:
                break
        assert (stops.text, ended) == want


def test_the_indentation_stop_by_hand():
    """Two cases worked through llama-server's process_token by hand: the first new line's check comes
    one token after the token that began its line (later lines are found a token earlier), and the
    line's text is cut, its indentation kept."""
    stops = Stops({"n_indent": 4})
    assert [stops.cut(p, 0)[1] for p in ["    a", "\n", "b"]] == [False, False, False]  # "b" began the line: not yet
    assert stops.cut("c", 0) == ("", True) and stops.text == "    a\n"
    stops = Stops({"n_indent": 2})
    assert [stops.cut(p, 0)[1] for p in ["x", "\n", "  y", "\n", "z"]] == [False] * 4 + [True]  # no lag past the first
    assert stops.text == "x\n  y\n"
    with pytest.raises(RequestError):
        Stops({"t_max_predict_ms": "500"})
    with pytest.raises(RequestError):
        Stops({"n_indent": True})


def test_a_verify_steps_tokens_are_checked_one_by_one():
    """A delta of several tokens (speculation) is checked token by token: the middle is the one the
    same tokens give one at a time, and the streamed delta carries the text up to the cut."""
    import asyncio

    from specserve.server.routes.infill import _Reply
    from specserve.types import StreamDelta
    texts = {1: "    a", 2: "\n", 3: "b", 4: "\n", 5: "c", 6: " = 1"}

    def run(groups):
        reply = _Reply("m", 3, False, None, Stops({"n_indent": 4}), texts.__getitem__, 0.0)

        async def engine():
            for g in groups:
                yield StreamDelta(index=0, text="".join(texts[t] for t in g), token_ids=list(g))

        async def collect():
            return [d async for d in reply.timed(engine())]
        return asyncio.run(collect()), reply.stops.text
    one, one_text = run([[t] for t in texts])
    grouped, grouped_text = run([[1, 2, 3, 4], [5, 6]])
    assert one_text == grouped_text == "    a\n"
    assert "".join(d.text for d in grouped) == "    a\nb" and grouped[-1].finish_reason == "length"


def test_response_fields_pick_nested_values_by_path():
    obj = {"content": "x", "timings": {"prompt_n": 3, "predicted_ms": 1.5}}
    assert nested(["content", "timings/prompt_n", "timings/none", "nope/x"], obj) == {"content": "x", "timings/prompt_n": 3}


def test_llama_servers_fields_map_onto_the_request_with_its_defaults():
    defaults = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "stream": False, "stream_options": None}
    assert request_fields({}, 4096) == (defaults, -1)  # n_predict -1: no max_tokens, until a stop or the context's end
    assert request_fields({"temperature": None, "n_predict": None, "seed": -1}, 4096) == (defaults, -1)  # nulls unset
    got, n = request_fields({"n_predict": 0, "seed": 7, "repeat_penalty": 1.1, "stop": ["\n"], "stream": True}, 4096)
    assert n == 0 and got["max_tokens"] == 1 and got["seed"] == 7 and got["repetition_penalty"] == 1.1
    assert got["stop"] == ["\n"] and got["stream_options"] == {"include_usage": True}
    assert request_fields({"n_predict": 64}, 4096)[0]["max_tokens"] == 64
    assert "max_tokens" not in request_fields({"n_predict": 5000}, 4096)[0]  # past the context: to its end
    # llama.vscode's samplers: no temperature step (1), no min-p (0), no penalties; the named ones keep their values
    got = request_fields({"samplers": ["top_k", "top_p", "infill"], "top_p": 0.99, "temperature": 0,
                          "repeat_penalty": 1.3}, 4096)[0]
    assert (got["temperature"], got["top_k"], got["top_p"], got["min_p"]) == (1.0, 40, 0.99, 0.0)
    assert (got["repetition_penalty"], got["presence_penalty"], got["frequency_penalty"]) == (1.0, 0.0, 0.0)
    got = request_fields({"samplers": "kte", "temperature": 0.2, "repeat_penalty": 1.3}, 4096)[0]
    assert (got["temperature"], got["top_k"], got["top_p"], got["min_p"], got["repetition_penalty"]) == (0.2, 40, 1.0, 0.0, 1.3)
    got = request_fields({"samplers": ["Temp", "top-k", "minp", "nucleus"], "temperature": 0.3}, 4096)[0]  # llama.cpp's aliases
    assert (got["temperature"], got["top_k"], got["top_p"], got["min_p"]) == (0.3, 40, 0.95, 0.05)
    for bad in ({"n_predict": "8"}, {"n_predict": True}, {"stream": "yes"}, {"samplers": 3}, {"samplers": [1]}):
        with pytest.raises(RequestError):
            request_fields(bad, 4096)
