"""Tool calls (server/tools.py): the Hermes parser on tagged, untagged and broken answers, and a
choice's ToolStream split at every point giving what the whole answer gives."""
import json

import pytest

pytest.importorskip("fastapi")
from specserve.server.tools import ToolMode, ToolStream, merge_calls, parse_hermes, parse_required, required_schema  # noqa: E402

NAMES = ("get_weather", "add")
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TWO = CALL + '\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'


@pytest.mark.parametrize("text, content, calls", [
    (CALL, "", [("get_weather", '{"city": "Paris"}')]),
    ("Let me look.\n" + TWO, "Let me look.\n", [("get_weather", '{"city": "Paris"}'), ("add", '{"a": 1, "b": 2}')]),
    (CALL[:-len("</tool_call>")], "", [("get_weather", '{"city": "Paris"}')]),  # the answer ended in the block
    ('<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}</tool_call>', "",
     [("get_weather", '{"city": "Oslo"}')]),  # arguments written as a JSON string
    ('{"name": "get_weather", "arguments": {"city": "Paris"}}', "", [("get_weather", '{"city": "Paris"}')]),  # untagged
    ('```json\n{"name": "add", "arguments": {"a": 1}}\n{"name": "add", "arguments": {"a": 2}}\n```', "",
     [("add", '{"a": 1}'), ("add", '{"a": 2}')]),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": </tool_call>', None, []),  # broken JSON: all content
    ('<tool_call>{"arguments": {}}</tool_call>', None, []),  # no name
    ('{"name": "not_a_tool", "arguments": {}}', None, []),  # untagged, naming no tool: an answer, not a call
    ('{"name": "add", "arguments": {"a": 1}}\n{"temperature": 21}', None, []),  # a call, then an object that is not one
    ("The weather is fine.", None, []),
])
def test_hermes_parser(text, content, calls):
    got_content, got_calls = parse_hermes(text, NAMES)
    assert got_calls == calls
    assert got_content == (text if content is None else content)
    for _, args in got_calls:
        assert isinstance(json.loads(args), dict)


def test_required_answers_parse_and_their_schema_names_each_tool():
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in NAMES]
    schema = required_schema(tools, parallel=True)
    assert [o["properties"]["name"]["const"] for o in schema["items"]["anyOf"]] == list(NAMES)
    assert "maxItems" not in schema and required_schema(tools, parallel=False)["maxItems"] == 1
    assert required_schema(tools[:1], True)["items"]["properties"]["arguments"] == {"type": "object"}
    assert parse_required('[{"name": "add", "arguments": {"a": 1}}]') == [("add", '{"a": 1}')]
    assert parse_required('[{"name": "add", "arguments": {"a": ') == []  # cut short by max_tokens
    assert parse_required('{"name": "add"}') == []


def _run(mode: ToolMode, pieces: list[str], reason: str = "stop"):
    """The stream's content, calls folded into a whole message, and finish reason."""
    st, content, message = ToolStream(mode), "", {}
    for i, p in enumerate(pieces):
        c, calls = st.push(p, i == len(pieces) - 1)
        content += c
        merge_calls(message, calls)
    return content, [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])], \
        st.finish_reason(reason)


@pytest.mark.parametrize("text", [CALL, "Let me look.\n" + TWO, '{"name": "add", "arguments": {"a": 1}}',
                                  "Plain answer < with tags <tool_ and braces {", '{"json": "but not a call"}',
                                  "```python\nx = 1\n```", '<tool_call>\n{"name": broken</tool_call> text'])
def test_a_streamed_answer_at_every_split_gives_what_the_whole_answer_gives(text):
    mode = ToolMode("auto", names=NAMES)
    whole = _run(mode, [text])
    content, calls = parse_hermes(text, NAMES)
    assert whole == (content, calls, "tool_calls" if calls else "stop")
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1, 7):
            assert _run(mode, [text[:i], text[i:j], text[j:]]) == whole, (i, j)
    # nothing that is part of a call is ever sent as content, even before the answer ends
    st, sent = ToolStream(mode), ""
    for ch in text:
        sent += st.push(ch, False)[0]
    assert whole[0].startswith(sent) and "<tool_call>" not in sent


def test_a_named_call_streams_its_arguments_and_keeps_stop():
    mode = ToolMode("named", name="add", names=NAMES)
    st = ToolStream(mode)
    first = st.push('{"a": ', False)[1]
    assert first[0]["id"].startswith("call_") and first[0]["function"] == {"name": "add", "arguments": '{"a": '}
    assert st.push("1}", True) == ("", [{"index": 0, "function": {"arguments": "1}"}}])
    assert st.finish_reason("stop") == "stop" and st.finish_reason("length") == "length"
    assert _run(mode, ['{"a"', ": 1}"])[:2] == ("", [("add", '{"a": 1}')])


def test_parallel_false_keeps_the_first_call_and_length_stays_length():
    assert _run(ToolMode("auto", parallel=False, names=NAMES), [TWO])[1] == [("get_weather", '{"city": "Paris"}')]
    assert _run(ToolMode("auto", names=NAMES), [CALL], reason="length")[2] == "length"
    assert _run(ToolMode("required", names=NAMES), ['[{"name": "add", "arguments": {}}]']) == ("", [("add", "{}")], "tool_calls")
    assert _run(ToolMode("required", names=NAMES), ['[{"name": "add", "argu'], reason="length") == \
        ('[{"name": "add", "argu', [], "length")
