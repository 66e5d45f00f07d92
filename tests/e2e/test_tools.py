"""Tool calls through the server with the official `openai` client, request for request against
LLM.generate / LLM.chat: a named function and "required" guided to their schemas on the embedded model
(whose template lists no tools), "auto" refused there, and on Qwen2.5-Coder-0.5B (whose template
does) the chat template rendered as HF transformers renders it, a call parsed, streamed as whole, and
a conversation carried on past the tool's answer."""
import json

import pytest

from specserve import LLM, SamplingParams
from specserve.server.tools import parameters, parse_hermes, required_schema

from .serving import running

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather now in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "a + b",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]


def serve(llm_args):
    from specserve import AsyncLLM
    from specserve.server.app import build_app
    from specserve.server.config import ServerConfig
    llm = AsyncLLM(*llm_args, kv_cache_gib=0.25)
    return llm, build_app(llm, ServerConfig(max_n=4))


@pytest.fixture(scope="module")
def embedded():
    llm, app = serve(())
    with running(app) as port:
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=120), llm.model_name
    llm.shutdown()


def _calls(message):
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


def _streamed(stream):
    """(content, [(name, arguments)], finish reason) of a streamed choice 0, its call entries folded."""
    content, calls, finish = "", {}, None
    for chunk in stream:
        for ch in chunk.choices:
            content += ch.delta.content or ""
            for e in ch.delta.tool_calls or []:
                if e.id:
                    assert e.type == "function" and e.function.name and e.index not in calls
                    calls[e.index] = [e.function.name, ""]
                calls[e.index][1] += e.function.arguments or ""
            finish = ch.finish_reason or finish
    return content, [(n, json.loads(a)) for _, (n, a) in sorted(calls.items())], finish


def test_a_named_function_is_its_schema_guided_and_streams_as_whole(embedded, embedded_llm):
    client, model = embedded
    choice = {"type": "function", "function": {"name": "get_weather"}}
    greedy = SamplingParams(temperature=0, max_tokens=48, guided_json=parameters(WEATHER))
    want = embedded_llm.chat(ASK, greedy)[0].outputs[0]  # the template lists no tools: the same prompt
    got = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=48, temperature=0)
    msg = got.choices[0].message
    assert msg.content is None and len(msg.tool_calls) == 1 and msg.tool_calls[0].id.startswith("call_")
    assert _calls(msg) == [("get_weather", json.loads(want.text))]
    jsonschema.validate(json.loads(msg.tool_calls[0].function.arguments), parameters(WEATHER))
    assert got.choices[0].finish_reason == "stop"  # as OpenAI answers a named function
    stream = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=48,
                                            temperature=0, stream=True)
    assert _streamed(stream) == ("", _calls(msg), "stop")


def test_required_is_a_list_of_calls_guided_and_streams_as_whole(embedded, embedded_llm):
    client, model = embedded
    ask = [{"role": "user", "content": "Add 2 and 3, and tell me the weather in Oslo."}]
    greedy = SamplingParams(temperature=0, max_tokens=96, guided_json=required_schema(TOOLS, parallel=True))
    want = json.loads(embedded_llm.chat(ask, greedy)[0].outputs[0].text)
    got = client.chat.completions.create(model=model, messages=ask, tools=TOOLS, tool_choice="required", max_tokens=96,
                                         temperature=0)
    assert _calls(got.choices[0].message) == [(c["name"], c["arguments"]) for c in want] and want
    assert got.choices[0].finish_reason == "tool_calls" and got.choices[0].message.content is None
    for name, args in _calls(got.choices[0].message):
        jsonschema.validate(args, parameters(next(t for t in TOOLS if t["function"]["name"] == name)))
    stream = client.chat.completions.create(model=model, messages=ask, tools=TOOLS, tool_choice="required", max_tokens=96,
                                            temperature=0, stream=True)
    assert _streamed(stream) == ("", _calls(got.choices[0].message), "tool_calls")
    one = client.chat.completions.create(model=model, messages=ask, tools=TOOLS, tool_choice="required", max_tokens=96,
                                         temperature=0, parallel_tool_calls=False)
    assert len(one.choices[0].message.tool_calls) == 1


def test_tool_choice_none_is_a_plain_answer_and_a_past_call_renders(embedded, embedded_llm):
    client, model = embedded
    greedy = SamplingParams(temperature=0, max_tokens=16)
    got = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=16, temperature=0)
    assert got.choices[0].message.content == embedded_llm.chat(ASK, greedy)[0].outputs[0].text
    assert not got.choices[0].message.tool_calls and got.choices[0].finish_reason == "length"
    past = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "sunny", "temperature": 21}'}]
    got = client.chat.completions.create(model=model, messages=past, tools=TOOLS, tool_choice="none", max_tokens=16, temperature=0)
    want = [{"role": m["role"], "content": m["content"] or ""} for m in past]  # what this model's template reads of them
    assert got.choices[0].message.content == embedded_llm.chat(want, greedy)[0].outputs[0].text


@pytest.mark.parametrize("body, param", [
    (dict(tools=TOOLS), "tools"),  # "auto" with a template that lists no tools
    (dict(tools=TOOLS, tool_choice="auto"), "tools"),
    (dict(tool_choice="required"), "tool_choice"),
    (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
    (dict(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}), "tool_choice"),
    (dict(tools=[{"type": "function", "function": {"name": "has space"}}], tool_choice="required"), None),
    (dict(tools=[{"type": "retrieval"}], tool_choice="required"), None),
    (dict(functions=[ADD["function"]]), "functions"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}], tool_choice="required"), "tools"),
    (dict(tools=TOOLS, tool_choice="none", messages=ASK + [{"role": "assistant", "tool_calls": [
        {"function": {"name": "add", "arguments": "{not json"}}]}]), "messages"),
])
def test_tool_requests_this_server_cannot_honour_are_400s_naming_why(embedded, body, param):
    """The chat endpoint's refusals; /tokenize's are in test_tokenize_counts_a_conversation_with_its_tools."""
    client, model = embedded
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, max_tokens=4, **{"messages": ASK, **body})
    assert e.value.status_code == 400
    if param is not None:
        assert e.value.body["param"] == param, e.value.body


# --- Qwen2.5-Coder-0.5B, whose template lists tools ------------------------------------------------

@pytest.fixture(scope="module")
def qwen(pulled):
    """(a client of a server of the 0.5B, an LLM of it beside, the served model's name)."""
    path = pulled("qwen2.5-coder-0.5b")
    llm, app = serve((path,))
    with running(app) as port:
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=300), \
            LLM(path, kv_cache_gib=0.25), llm.model_name
    llm.shutdown()


def test_qwen_template_renders_tools_and_calls_as_hf_transformers_does(qwen):
    render = pytest.importorskip("transformers.utils.chat_template_utils").render_jinja_template
    tok = qwen[1].tokenizer
    assert tok.takes_tools
    conv = ASK + [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris <&> 'x'"}}}]},
        {"role": "tool", "content": '{"sky": "sunny"}'}, {"role": "tool", "content": "ünïcode"}]
    for c in (ASK, conv):
        ours = tok.apply_chat_template(c, add_generation_prompt=True, tools=TOOLS)
        hf = render([c], tools=TOOLS, chat_template=tok.chat_template, add_generation_prompt=True, **tok.special_tokens)
        assert ours == (hf[0][0] if isinstance(hf, tuple) else hf[0])
    assert '"description": "The weather now in a city"' in ours and "<tool_response>\nünïcode" in ours
    begun = ASK + [{"role": "assistant", "content": "The weather in Paris is "}]  # continue_final_message too
    ours = tok.apply_chat_template(begun, add_generation_prompt=False, tools=TOOLS, continue_final_message=True)
    hf = render([begun], tools=TOOLS, chat_template=tok.chat_template, add_generation_prompt=False,
                continue_final_message=True, **tok.special_tokens)
    assert ours == (hf[0][0] if isinstance(hf, tuple) else hf[0]) and ours.endswith("The weather in Paris is ")
    # the tags are text Qwen writes, kept when decoding (HF: added tokens that are not special)
    ids = tok.encode("<tool_call>\n{}\n</tool_call><|im_end|>", add_special_tokens=False)
    assert len(ids) == 5 and tok.decode(ids) == "<tool_call>\n{}\n</tool_call>"


def test_qwen_calls_a_tool_and_answers_from_its_result(qwen):
    client, llm, model = qwen
    want = llm.chat(ASK, SamplingParams(temperature=0, max_tokens=40), tools=TOOLS)[0].outputs[0]
    got = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, max_tokens=40, temperature=0)
    msg = got.choices[0].message
    content, calls = parse_hermes(want.text, ("get_weather", "add"))
    assert _calls(msg) == [(n, json.loads(a)) for n, a in calls] and (msg.content or "") == content
    assert _calls(msg)[0][0] == "get_weather" and _calls(msg)[0][1]["city"] == "Paris"
    assert got.choices[0].finish_reason == "tool_calls" and got.usage.completion_tokens == len(want.token_ids)
    stream = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, max_tokens=40, temperature=0,
                                            stream=True)
    assert _streamed(stream) == (msg.content or "", _calls(msg), "tool_calls")
    none = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=40, temperature=0)
    assert not none.choices[0].message.tool_calls and none.choices[0].message.content == want.text  # listed, not parsed
    assert none.usage.prompt_tokens == got.usage.prompt_tokens == len(llm.tokenizer.encode(
        llm.tokenizer.apply_chat_template(ASK, tools=TOOLS), add_special_tokens=False))
    past = ASK + [msg.model_dump(exclude_none=True),
                  {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": '{"sky": "sunny", "temperature": 21}'}]
    answer = client.chat.completions.create(model=model, messages=past, tools=TOOLS, max_tokens=48, temperature=0)
    assert not answer.choices[0].message.tool_calls and "21" in answer.choices[0].message.content


def test_tokenize_counts_a_conversation_with_its_tools(qwen, embedded):
    """/tokenize (vLLM's) with tools: the prompt tokens the chat endpoint reports for them; a template
    that takes none, or a bare prompt with tools, is a 400 naming tools."""
    import http.client
    client, llm, model = qwen

    def tokenize(c, body):
        conn = http.client.HTTPConnection("127.0.0.1", c.base_url.port, timeout=60)
        conn.request("POST", "/tokenize", body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        out = r.status, json.loads(r.read())
        conn.close()
        return out
    got = client.chat.completions.create(model=model, messages=ASK, tools=TOOLS, max_tokens=1, temperature=0)
    status, body = tokenize(client, {"messages": ASK, "tools": TOOLS})
    assert status == 200 and body["count"] == got.usage.prompt_tokens > tokenize(client, {"messages": ASK})[1]["count"]
    for c, body in ((embedded[0], {"messages": ASK, "tools": TOOLS}), (client, {"prompt": "hi", "tools": TOOLS})):
        status, err = tokenize(c, body)
        assert status == 400 and err["error"]["param"] == "tools", err


def test_ollamas_chat_with_tools_gets_the_call_with_its_arguments_as_an_object(qwen):
    """ollama's /api/chat (server/routes/ollama.py) with tools: the call the chat endpoint parses (the
    test above: get_weather for Paris), in ollama's form (arguments an object, not JSON text), whole
    and streamed."""
    ollama = pytest.importorskip("ollama")
    client, llm, model = qwen
    oc = ollama.Client(host=f"http://127.0.0.1:{client.base_url.port}", timeout=120)
    got = oc.chat(model=model, messages=ASK, tools=TOOLS, options={"temperature": 0, "num_predict": 40})
    calls = [(c.function.name, dict(c.function.arguments)) for c in got.message.tool_calls]
    assert calls[0][0] == "get_weather" and calls[0][1]["city"] == "Paris" and got.done_reason == "stop"
    streamed = [c for p in oc.chat(model=model, messages=ASK, tools=TOOLS, options={"temperature": 0, "num_predict": 40},
                                   stream=True) for c in p.message.tool_calls or []]
    assert [(c.function.name, dict(c.function.arguments)) for c in streamed] == calls
