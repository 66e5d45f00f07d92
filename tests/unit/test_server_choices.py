"""The choice accumulator /v1/completions and /v1/chat/completions share (specserve/server/choices.py),
fed deltas without an engine or HTTP: the same deltas give the same choices in both endpoints' shapes
(text, finish and stop reasons, logprobs, usage), a stream's chunks add up to the whole response, and
the choices' JSON is what the server has always sent, key for key."""
import json

import pytest

pytest.importorskip("fastapi")

from specserve.origins import OriginRuns  # noqa: E402
from specserve.server.choices import Choices  # noqa: E402
from specserve.server.routes.chat import ChatChoice  # noqa: E402
from specserve.server.routes.completions import CompletionChoice  # noqa: E402
from specserve.types import StreamDelta  # noqa: E402


class CharTokenizer:
    """Token i is chr(ord('a') + i)."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + t) for t in ids)


def token_text(t: int) -> str:
    return CharTokenizer().decode([t])


def deltas() -> list[tuple[int, StreamDelta]]:
    """(prompt, delta) of two prompts with n = 2, interleaved as merged streams give them: a delta with
    nothing new (no text held back yet), one whose text is held back (a possible stop string), one
    whose stop string is cut from the text (its token counted, its text not), stop reasons, logprobs
    with top-2 alternatives."""
    def d(index, ids, text, finish=None, stop=None, cached=None):
        return StreamDelta(index=index, text=text, token_ids=ids, logprobs=[-0.5 * (t + 1) for t in ids],
                           top_logprobs=[{t: -0.5 * (t + 1), t + 1: -9.0} for t in ids], finish_reason=finish,
                           stop_reason=stop, num_cached_tokens=cached)
    # each sample's first delta says how much of its prompt the prefix cache held (prompt 0: 8, shared by its
    # two samples; prompt 1: none)
    return [(0, d(0, [0, 1], "ab", cached=8)), (1, d(0, [2], "c", cached=0)), (0, d(1, [3], "", cached=8)), (0, d(1, [], "")),
            (0, d(0, [4, 8], "e", "stop", "\n")), (1, d(1, [5, 6], "fg", "length", cached=0)), (0, d(1, [7], "dh", "stop", 7)),
            (1, d(0, [], "", "stop"))]


def whole(fmt, seq=None, n=2):
    ch = Choices(fmt, n, prompt_tokens=11)
    for pi, dl in seq or deltas():
        ch.add(pi, dl)
    return ch.choices(), ch.usage()


def streamed(fmt, seq=None, n=2, origin_runs=None):
    ch = Choices(fmt, n, prompt_tokens=11, origin_runs=origin_runs)
    chunks = [c for pi, dl in seq or deltas() if (c := ch.chunk(pi, dl)) is not None]
    return chunks, ch.usage()


def test_chat_and_completions_give_the_same_choices_from_the_same_deltas():
    comp, comp_usage = whole(CompletionChoice(token_text))
    chat, chat_usage = whole(ChatChoice(token_text))
    assert comp_usage == chat_usage == {"prompt_tokens": 11, "completion_tokens": 9, "total_tokens": 20,
                                        "prompt_tokens_details": {"cached_tokens": 8}}
    assert [c["index"] for c in comp] == [c["index"] for c in chat] == [0, 1, 2, 3]  # prompt i's sample k: i * 2 + k
    assert [c["text"] for c in comp] == [c["message"]["content"] for c in chat] == ["abe", "dh", "c", "fg"]
    assert all(c["message"]["role"] == "assistant" for c in chat)
    for a, b in zip(comp, chat):
        assert (a["finish_reason"], a["stop_reason"]) == (b["finish_reason"], b["stop_reason"])
        content = b["logprobs"]["content"]
        assert a["logprobs"]["tokens"] == [t["token"] for t in content]
        assert a["logprobs"]["token_logprobs"] == [t["logprob"] for t in content]
        assert a["logprobs"]["top_logprobs"] == [{x["token"]: x["logprob"] for x in t["top_logprobs"]} for t in content]
    assert [(c["finish_reason"], c["stop_reason"]) for c in comp] == [("stop", "\n"), ("stop", 7), ("stop", None),
                                                                      ("length", None)]
    assert comp[0]["logprobs"]["text_offset"] == [0, 1, 2, 3]  # offsets run on across deltas


def test_whole_choices_are_what_the_server_sends_key_for_key():
    comp, _ = whole(CompletionChoice(token_text))
    chat, _ = whole(ChatChoice(token_text))
    assert json.dumps(comp[3]) == (
        '{"index": 3, "text": "fg", "logprobs": {"tokens": ["f", "g"], "token_logprobs": [-3.0, -3.5], "top_logprobs": '
        '[{"f": -3.0, "g": -9.0}, {"g": -3.5, "h": -9.0}], "text_offset": [0, 1]}, "finish_reason": "length", '
        '"stop_reason": null}')
    assert json.dumps(chat[2]) == (
        '{"index": 2, "message": {"role": "assistant", "content": "c"}, "logprobs": {"content": [{"token": "c", '
        '"logprob": -1.5, "bytes": [99], "top_logprobs": [{"token": "c", "logprob": -1.5, "bytes": [99]}, '
        '{"token": "d", "logprob": -9.0, "bytes": [100]}]}]}, "finish_reason": "stop", "stop_reason": null}')


def lp_tokens(logprobs: dict) -> list[str]:
    """The tokens of a choice's logprobs, completions' shape or chat's."""
    return logprobs["tokens"] if "tokens" in logprobs else [x["token"] for x in logprobs["content"]]


def test_a_stream_adds_up_to_the_whole_response():
    for fmt, body in ((CompletionChoice(token_text), lambda c: c["text"]),
                      (ChatChoice(token_text), lambda c: c["delta"].get("content", ""))):
        chunks, usage = streamed(fmt)
        full, full_usage = whole(fmt)
        assert usage == full_usage
        for want in full:
            mine = [c for c in chunks if c["index"] == want["index"]]
            text = "".join(body(c) for c in mine)
            assert text == (want["text"] if "text" in want else want["message"]["content"])
            assert [c["finish_reason"] for c in mine][-1] == want["finish_reason"]
            assert all(c["finish_reason"] is None for c in mine[:-1])
            assert mine[-1]["stop_reason"] == want["stop_reason"]
            assert [t for c in mine if c["logprobs"] for t in lp_tokens(c["logprobs"])] == lp_tokens(want["logprobs"])


def test_which_deltas_a_stream_sends():
    seq = [(0, StreamDelta(index=0, text="", token_ids=[])), (0, StreamDelta(index=0, text="", token_ids=[3])),
           (0, StreamDelta(index=0, text="abc", token_ids=[4])), (0, StreamDelta(index=0, text="", token_ids=[], finish_reason="stop"))]
    comp, comp_usage = streamed(CompletionChoice(token_text), seq, n=1)
    chat, _ = streamed(ChatChoice(token_text), seq, n=1)
    # completions: nothing to show, nothing sent; chat: the role goes in the first chunk, even an empty one
    assert [c["text"] for c in comp] == ["abc", ""]
    assert [c["delta"] for c in chat] == [{"role": "assistant"}, {"content": "abc"}, {}]
    assert comp_usage["completion_tokens"] == 2
    assert json.dumps(chat[0], separators=(",", ":")) == (
        '{"index":0,"delta":{"role":"assistant"},"logprobs":null,"finish_reason":null,"stop_reason":null}')


def test_streamed_origins_run_per_choice_and_only_when_asked():
    seq = [(0, StreamDelta(index=0, text="a", token_ids=[0], origins=["target"])),
           (0, StreamDelta(index=1, text="", token_ids=[], origins=[])),
           (0, StreamDelta(index=1, text="bc", token_ids=[1, 2], origins=["draft", "draft"])),
           (0, StreamDelta(index=0, text="de", token_ids=[3, 4], origins=["draft", "target"], finish_reason="stop")),
           (0, StreamDelta(index=1, text="", token_ids=[], origins=[], finish_reason="length"))]
    chunks, _ = streamed(CompletionChoice(token_text), seq, origin_runs=lambda: OriginRuns(CharTokenizer()))
    assert [(c["index"], c["origins"], c["origin_runs"]) for c in chunks] == [
        (0, ["target"], [["a", "target"]]), (1, ["draft", "draft"], [["bc", "draft"]]),
        (0, ["draft", "target"], [["d", "draft"], ["e", "target"]]), (1, [], [])]
    plain, _ = streamed(CompletionChoice(token_text), seq)
    assert all("origins" not in c and "origin_runs" not in c for c in plain)


def test_a_choice_whose_first_delta_is_empty_still_collects_its_top_logprobs():
    """A choice's first delta without tokens (its text held back, say) left top_logprobs None, and
    the next delta's alternatives were then added to None: a 500 for the whole request."""
    empty = StreamDelta(index=0, text="", token_ids=[], logprobs=[], top_logprobs=[])
    later = StreamDelta(index=0, text="ab", token_ids=[0, 1], logprobs=[-0.5, -1.0],
                        top_logprobs=[{0: -0.5}, {1: -1.0}], finish_reason="length")
    (choice,), _ = whole(CompletionChoice(token_text), [(0, empty), (0, later)], n=1)
    assert choice["text"] == "ab" and choice["logprobs"]["tokens"] == ["a", "b"]
    assert choice["logprobs"]["top_logprobs"] == [{"a": -0.5}, {"b": -1.0}]
