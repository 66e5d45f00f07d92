"""The OpenAI-compatible server on loopback, driven by the official `openai` client and raw HTTP:
outputs token-identical to LLM.generate at temperature 0, streaming = non-streaming, n > 1 with seeds,
real top logprobs, OpenAI error objects with the right statuses, no KV blocks left behind by clients
that disconnect, and fuzzed bodies never answered with a 5xx."""
import http.client
import json
import threading
import time

import pytest

from specserve import SamplingParams

from .serving import running

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")
KEY = "test-key"
PROMPTS = ["def add(a, b):", "The capital of France is", "import numpy as np\n"]


@pytest.fixture(scope="module")
def server():
    from specserve import AsyncLLM
    from specserve.server.app import build_app
    from specserve.server.config import ServerConfig

    llm = AsyncLLM(kv_cache_gib=0.25)
    app = build_app(llm, ServerConfig(api_key=KEY, max_concurrent_requests=24, max_n=4, max_body_bytes=64 * 1024))
    with running(app) as port:
        yield {"port": port, "llm": llm, "model": llm.model_name}
    llm.shutdown()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server['port']}/v1", api_key=KEY, max_retries=0, timeout=120)


def raw(server, method, path, body=None, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", server["port"], timeout=120)
    h = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json", **(headers or {})}
    data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
    conn.request(method, path, body=data, headers=h)
    r = conn.getresponse()
    out = r.status, r.read()
    conn.close()
    return out


def blocks_in_use(server) -> int:
    """KV blocks in use once the engine has gone idle (waits for in-flight aborts to land)."""
    llm = server["llm"]
    deadline = time.time() + 30
    while time.time() < deadline:
        st = llm.stats
        if st.running == 0 and st.waiting == 0 and st.kv_blocks_used == 0:
            break
        time.sleep(0.1)
    return llm.stats.kv_blocks_used


def test_completions_and_chat_equal_llm_generate_at_temperature_0(server, client, embedded_llm):
    greedy = SamplingParams(temperature=0, max_tokens=24)
    for prompt in PROMPTS:
        want = embedded_llm.generate(prompt, greedy)[0].outputs[0]
        got = client.completions.create(model=server["model"], prompt=prompt, max_tokens=24, temperature=0)
        assert got.choices[0].text == want.text and got.usage.completion_tokens == len(want.token_ids)
        assert got.choices[0].finish_reason == want.finish_reason
        streamed = client.completions.create(model=server["model"], prompt=prompt, max_tokens=24, temperature=0,
                                             stream=True, stream_options={"include_usage": True})
        chunks = list(streamed)
        assert "".join(c.choices[0].text for c in chunks if c.choices) == want.text
        assert chunks[-1].usage.completion_tokens == len(want.token_ids)
    conv = [{"role": "user", "content": "What is the capital of France?"}]
    want = embedded_llm.chat(conv, SamplingParams(temperature=0, max_tokens=32))[0].outputs[0]
    got = client.chat.completions.create(model=server["model"], messages=conv, max_tokens=32, temperature=0)
    assert got.choices[0].message.content == want.text and got.choices[0].message.role == "assistant"
    assert got.usage.completion_tokens == len(want.token_ids)
    streamed = client.chat.completions.create(model=server["model"], messages=conv, max_tokens=32, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == want.text


def test_n_samples_with_a_seed_repeat_and_equal_llm_generate(server, client, embedded_llm):
    params = SamplingParams(n=3, temperature=0.8, seed=5, max_tokens=16)
    want = [o.text for o in embedded_llm.generate(PROMPTS[0], params)[0].outputs]
    for _ in range(2):
        got = client.completions.create(model=server["model"], prompt=PROMPTS[0], n=3, temperature=0.8, seed=5, max_tokens=16)
        assert [c.text for c in sorted(got.choices, key=lambda c: c.index)] == want
    assert len(set(want)) > 1
    # several prompts at once: choice index = prompt * n + sample
    got = client.completions.create(model=server["model"], prompt=PROMPTS[:2], n=2, temperature=0, max_tokens=8)
    assert sorted(c.index for c in got.choices) == [0, 1, 2, 3]


def test_penalties_and_min_p_equal_llm_generate(server, client, embedded_llm):
    """OpenAI's presence / frequency penalties and vLLM's extras (repetition_penalty, min_p, min_tokens,
    include_stop_str_in_output, allowed_token_ids, bad_words, truncate_prompt_tokens) reach the engine: the answer is LLM.generate's with
    the same SamplingParams (seeded samples, and greedy)."""
    pen = dict(presence_penalty=0.6, frequency_penalty=0.4, stop=["\n"])
    extra = dict(repetition_penalty=1.3, min_p=0.1, min_tokens=3, include_stop_str_in_output=True,
                 allowed_token_ids=list(range(2000)), bad_words=["the"], truncate_prompt_tokens=5)
    for t in (0.9, 0):
        params = SamplingParams(n=2, temperature=t, seed=5, max_tokens=24, **pen, **extra)
        want = [o.text for o in embedded_llm.generate(PROMPTS[0], params)[0].outputs]
        got = client.completions.create(model=server["model"], prompt=PROMPTS[0], n=2, temperature=t, seed=5, max_tokens=24,
                                        **pen, extra_body=extra)
        assert [c.text for c in sorted(got.choices, key=lambda c: c.index)] == want
        assert got.usage.prompt_tokens == 5  # the prompt as served
    plain = embedded_llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=24))[0].outputs[0].text
    assert want[0] != plain


def test_masked_out_alternatives_are_written_as_vllms_floor_not_as_infinity(server, client):
    """With allowed_token_ids smaller than top_logprobs, the rest of the top list is tokens of -inf
    log-probability: JSON has no infinity, so they are written as -9999.0 (vLLM's), whole and streamed."""
    extra = {"allowed_token_ids": [28, 29]}
    got = client.completions.create(model=server["model"], prompt="x", max_tokens=3, temperature=0, logprobs=5, extra_body=extra)
    tops = got.choices[0].logprobs.top_logprobs
    assert len(tops) == 3 and all(-9999.0 in t.values() and len(t) == 5 for t in tops)
    msgs = [{"role": "user", "content": "hi"}]
    chunks = client.chat.completions.create(model=server["model"], messages=msgs, max_tokens=3, temperature=0, logprobs=True,
                                            top_logprobs=5, stream=True, extra_body=extra)
    alts = [a.logprob for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content
            for a in e.top_logprobs]
    assert len(alts) == 15 and min(alts) == -9999.0


def test_best_of_and_a_time_budget_answer_as_llm_generate_does(server, client, embedded_llm):
    params = SamplingParams(n=2, best_of=4, temperature=1.0, seed=9, max_tokens=16)
    want = [o.text for o in embedded_llm.generate(PROMPTS[1], params)[0].outputs]
    got = client.completions.create(model=server["model"], prompt=PROMPTS[1], n=2, best_of=4, temperature=1.0, seed=9,
                                    max_tokens=16)
    assert [c.text for c in sorted(got.choices, key=lambda c: c.index)] == want
    conv = [{"role": "user", "content": "Name a colour."}]
    got = client.chat.completions.create(model=server["model"], messages=conv, n=2, temperature=1.0, seed=4, max_tokens=24,
                                         extra_body={"best_of": 4, "best_of_deadline_s": 60})
    want = embedded_llm.chat(conv, SamplingParams(n=2, best_of=4, temperature=1.0, seed=4, max_tokens=24,
                                                  best_of_deadline_s=60))[0].outputs
    assert [c.message.content for c in sorted(got.choices, key=lambda c: c.index)] == [o.text for o in want]
    assert [c.index for c in got.choices] == [0, 1]


def test_streamed_origins_join_up_to_the_text_and_the_playground_is_served(server, embedded_llm):
    """return_origins (extra): each streamed choice has its tokens' origins and their text in runs;
    the runs join up to the answer and the origins count its tokens. GET / is the playground page."""
    for path, body in (("/v1/completions", {"prompt": PROMPTS[0]}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Say hi"}]})):
        status, raw_body = raw(server, "POST", path, {**body, "model": server["model"], "max_tokens": 20, "temperature": 0,
                                                      "stream": True, "return_origins": True})
        chunks = [json.loads(line[6:]) for line in raw_body.decode().split("\n\n") if line.startswith("data: {")]
        choices = [c["choices"][0] for c in chunks if c["choices"]]
        text = "".join(c.get("text") or c.get("delta", {}).get("content") or "" for c in choices)
        runs = "".join(t for c in choices for t, _ in c["origin_runs"])
        origins = [o for c in choices for o in c["origins"]]
        assert status == 200 and text and runs == text
        assert len(origins) == 20 and set(origins) == {"target"}  # no speculation on this server
    status, page = raw(server, "GET", "/", headers={"Authorization": ""})  # the page needs no key; /v1 does
    assert status == 200 and b"specserve playground" in page and b"/v1/chat/completions" in page


def test_top_logprobs_are_the_models(server, client, embedded_llm):
    want = embedded_llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=6, logprobs=3))[0].outputs[0]
    got = client.completions.create(model=server["model"], prompt=PROMPTS[0], max_tokens=6, temperature=0, logprobs=3)
    lp = got.choices[0].logprobs
    assert all(abs(a - b) < 1e-5 for a, b in zip(lp.token_logprobs, want.logprobs)) and len(lp.tokens) == 6
    tok = embedded_llm.tokenizer
    for top, ref in zip(lp.top_logprobs, want.top_logprobs):
        assert list(top) == [tok.decode([i], skip_special_tokens=False) for i in ref]
    conv = [{"role": "user", "content": "Say hi"}]
    got = client.chat.completions.create(model=server["model"], messages=conv, max_tokens=4, temperature=0, logprobs=True,
                                         top_logprobs=2)
    content = got.choices[0].logprobs.content
    assert len(content) == got.usage.completion_tokens and all(len(c.top_logprobs) == 2 for c in content)
    assert all(c.top_logprobs[0].logprob >= c.top_logprobs[1].logprob for c in content)


def test_echo_returns_the_prompt_and_its_logprobs_as_llm_generate_scores_them(server, client, embedded_llm):
    """echo with logprobs (how lm-evaluation-harness scores log-likelihoods through a server): each
    choice's text and logprobs start with its prompt's, the prompt's scores those of
    SamplingParams.prompt_logprobs, the completion LLM.generate's."""
    tok = embedded_llm.tokenizer
    ids = tok.encode(PROMPTS[2])
    got = client.completions.create(model=server["model"], prompt=[PROMPTS[0], PROMPTS[1]], max_tokens=4, temperature=0,
                                    echo=True, logprobs=2, n=2)
    assert len(got.choices) == 4 and got.usage.completion_tokens == 16  # the echoed prompts are not completion tokens
    as_ids = client.completions.create(model=server["model"], prompt=ids, max_tokens=4, temperature=0, echo=True, logprobs=2)
    for c, prompt in [(c, PROMPTS[c.index // 2]) for c in got.choices] + [(as_ids.choices[0], ids)]:
        want = embedded_llm.generate(prompt, SamplingParams(temperature=0, max_tokens=4, logprobs=2, prompt_logprobs=2))[0]
        text = prompt if isinstance(prompt, str) else tok.decode(prompt, skip_special_tokens=False)
        assert c.text == text + want.outputs[0].text
        lp = c.logprobs
        P = len(want.prompt_token_ids)
        assert lp.tokens == [tok.decode([t], skip_special_tokens=False) for t in want.prompt_token_ids + want.outputs[0].token_ids]
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert all(abs(a - b) < 1e-5 for a, b in zip(lp.token_logprobs[1:], want.prompt_logprobs[1:] + want.outputs[0].logprobs))
        assert [list(t) for t in lp.top_logprobs[1:P]] == [[tok.decode([i], skip_special_tokens=False) for i in t]
                                                            for t in want.prompt_top_logprobs[1:]]
        assert lp.text_offset[P] == len(text) and lp.text_offset == sorted(lp.text_offset)
    plain = client.completions.create(model=server["model"], prompt=PROMPTS[0], max_tokens=4, temperature=0, echo=True)
    assert plain.choices[0].text == got.choices[0].text and plain.choices[0].logprobs is None


def test_chat_continues_a_begun_answer_as_llm_chat_does(server, client, embedded_llm):
    """vLLM's continue_final_message (with add_generation_prompt false): the answer continues the last
    message, as LLM.chat's; /tokenize counts the same prompt; both flags set is a 400 naming it."""
    conv = [{"role": "user", "content": "Write a Python function that adds two numbers."},
            {"role": "assistant", "content": "def add("}]
    extra = {"continue_final_message": True, "add_generation_prompt": False}
    want = embedded_llm.chat(conv, SamplingParams(temperature=0, max_tokens=16), **extra)[0]
    got = client.chat.completions.create(model=server["model"], messages=conv, max_tokens=16, temperature=0, extra_body=extra)
    assert got.choices[0].message.content == want.outputs[0].text and got.usage.prompt_tokens == len(want.prompt_token_ids)
    status, body = raw(server, "POST", "/tokenize", {"model": server["model"], "messages": conv, **extra})
    assert status == 200 and json.loads(body)["tokens"] == want.prompt_token_ids
    for path in ("/v1/chat/completions", "/tokenize"):
        status, body = raw(server, "POST", path, {"model": server["model"], "messages": conv, "continue_final_message": True})
        assert status == 400 and json.loads(body)["error"]["param"] == "continue_final_message", body


def test_streamed_echo_sends_what_the_whole_response_holds(server, client):
    """echo streams as vLLM's does: each choice's first chunk starts with its prompt (its tokens' scores
    too, with logprobs); the chunks of a choice add up to the whole response's choice, text and
    logprobs, for text and token-id prompts, n > 1, logprobs 0 and 2, and a truncated prompt."""
    def joined(chunks):
        out = {}
        for ch in chunks:
            for c in ch.choices:
                o = out.setdefault(c.index, {"text": "", "tokens": [], "token_logprobs": [], "top": [], "offsets": []})
                o["text"] += c.text
                if c.logprobs is not None:
                    o["tokens"] += c.logprobs.tokens
                    o["token_logprobs"] += c.logprobs.token_logprobs
                    o["top"] += c.logprobs.top_logprobs or []
                    o["offsets"] += c.logprobs.text_offset
        return out

    ids = [1] + list(range(300, 306))
    for kw in (dict(prompt=[PROMPTS[0], PROMPTS[1]], n=2, logprobs=2), dict(prompt=ids, logprobs=0),
               dict(prompt=PROMPTS[2]), dict(prompt=PROMPTS[1], logprobs=1, extra_body={"truncate_prompt_tokens": 3})):
        args = dict(model=server["model"], max_tokens=5, temperature=0, echo=True, **kw)
        whole = client.completions.create(**args)
        streamed = joined(client.completions.create(**args, stream=True))
        assert sorted(streamed) == [c.index for c in sorted(whole.choices, key=lambda c: c.index)]
        for c in whole.choices:
            s = streamed[c.index]
            assert s["text"] == c.text
            if c.logprobs is None:
                assert s["tokens"] == []
                continue
            assert (s["tokens"], s["offsets"]) == (c.logprobs.tokens, c.logprobs.text_offset)
            assert s["token_logprobs"][0] is None and c.logprobs.token_logprobs[0] is None
            assert s["token_logprobs"][1:] == pytest.approx(c.logprobs.token_logprobs[1:], abs=1e-5)
            assert [t and sorted(t) for t in s["top"]] == [t and sorted(t) for t in (c.logprobs.top_logprobs or [])]
    lp = whole.choices[0].logprobs  # the last case: the truncated prompt is what is echoed and scored
    assert whole.usage.prompt_tokens == 3 and len(lp.tokens) == 3 + whole.usage.completion_tokens
    assert whole.choices[0].text.startswith("".join(lp.tokens[:3])) and PROMPTS[1].endswith("".join(lp.tokens[:3]))


def test_tokenize_counts_what_generation_feeds_the_model_and_detokenize_inverts_it(server, client, embedded_llm):
    m, tok = server["model"], embedded_llm.tokenizer
    for prompt in PROMPTS:
        status, body = raw(server, "POST", "/tokenize", {"model": m, "prompt": prompt, "return_token_strs": True})
        out = json.loads(body)
        assert status == 200 and out["tokens"] == tok.encode(prompt) and out["count"] == len(out["tokens"])
        assert out["max_model_len"] == server["llm"].max_model_len
        assert out["token_strs"] == [tok.decode([t], skip_special_tokens=False) for t in out["tokens"]]
        used = client.completions.create(model=m, prompt=prompt, max_tokens=1, temperature=0).usage.prompt_tokens
        assert out["count"] == used
        bare = json.loads(raw(server, "POST", "/tokenize", {"prompt": prompt, "add_special_tokens": False})[1])["tokens"]
        assert bare == tok.encode(prompt, add_special_tokens=False)
        status, body = raw(server, "POST", "/detokenize", {"model": m, "tokens": bare})
        assert status == 200 and json.loads(body) == {"prompt": prompt}
    conv = [{"role": "user", "content": "What is the capital of France?"}]
    chat = json.loads(raw(server, "POST", "/tokenize", {"messages": conv})[1])
    used = client.chat.completions.create(model=m, messages=conv, max_tokens=1, temperature=0).usage.prompt_tokens
    assert chat["count"] == used
    # without the assistant's turn opened: the same conversation, shorter by the generation prompt
    closed = json.loads(raw(server, "POST", "/tokenize", {"messages": conv, "add_generation_prompt": False})[1])["tokens"]
    assert len(closed) < chat["count"] and chat["tokens"][:len(closed)] == closed
    # special tokens come back as text: the template's markers are what the model saw
    text = json.loads(raw(server, "POST", "/detokenize", {"tokens": chat["tokens"]})[1])["prompt"]
    assert text == tok.decode(chat["tokens"], skip_special_tokens=False) and tok.special_tokens["eos_token"] in text
    for body, path, want in [({"prompt": "x", "messages": conv}, "/tokenize", 400), ({}, "/tokenize", 400),
                             ({"prompt": "x", "model": "gpt-9"}, "/tokenize", 404),
                             ({"tokens": [tok.vocab_size]}, "/detokenize", 400), ({"tokens": [-1]}, "/detokenize", 400),
                             ({"tokens": [1], "model": "gpt-9"}, "/detokenize", 404)]:
        status, payload = raw(server, "POST", path, body)
        assert status == want and json.loads(payload)["error"]["code"] == want, (body, payload)


@pytest.mark.parametrize("case", ["no key", "bad json", "unknown model", "n too big", "prompt too long", "bad temperature",
                                  "body too big", "unknown route", "empty messages", "penalty", "bad schema",
                                  "bad response_format", "streamed best_of", "best_of too big", "best_of below n"])
def test_errors_are_openai_error_objects_with_the_right_status(server, case):
    m = server["model"]
    status, body = {
        "no key": lambda: raw(server, "POST", "/v1/completions", {"model": m, "prompt": "x"}, {"Authorization": ""}),
        "bad json": lambda: raw(server, "POST", "/v1/completions", b'{"prompt": "x",'),
        "unknown model": lambda: raw(server, "POST", "/v1/completions", {"model": "gpt-9", "prompt": "x"}),
        "n too big": lambda: raw(server, "POST", "/v1/completions", {"model": m, "prompt": "x", "n": 99}),
        "prompt too long": lambda: raw(server, "POST", "/v1/completions", {"model": m, "prompt": [1] * 9000}),
        "bad temperature": lambda: raw(server, "POST", "/v1/chat/completions",
                                       {"model": m, "messages": [{"role": "user", "content": "x"}], "temperature": -1}),
        "body too big": lambda: raw(server, "POST", "/v1/completions", {"model": m, "prompt": "x" * 100_000}),
        "unknown route": lambda: raw(server, "GET", "/v1/nothing"),
        "empty messages": lambda: raw(server, "POST", "/v1/chat/completions", {"model": m, "messages": []}),
        "penalty": lambda: raw(server, "POST", "/v1/completions", {"model": m, "prompt": "x", "presence_penalty": 3}),
        "bad schema": lambda: raw(server, "POST", "/v1/chat/completions", {
            "model": m, "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer", "minimum": 5,
                                                                                                "maximum": 3}}}}),
        "bad response_format": lambda: raw(server, "POST", "/v1/chat/completions", {
            "model": m, "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}}),
        "streamed best_of": lambda: raw(server, "POST", "/v1/completions", {"model": m, "prompt": "x", "best_of": 2,
                                                                            "stream": True}),
        "best_of too big": lambda: raw(server, "POST", "/v1/completions", {"model": m, "prompt": "x", "best_of": 9}),
        "best_of below n": lambda: raw(server, "POST", "/v1/completions", {"model": m, "prompt": "x", "n": 3, "best_of": 2}),
    }[case]()
    want = {"no key": 401, "unknown model": 404, "body too big": 413, "unknown route": 404}.get(case, 400)
    assert status == want, body
    err = json.loads(body)["error"]
    assert err["code"] == want and err["message"] and err["type"]


def test_response_format_json_schema_and_json_object(server, client, embedded_llm):
    """The chat endpoint's response_format and the vLLM extras give what LLM.generate gives with the
    same guided_* fields, valid against the schema."""
    import jsonschema
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "population": {"type": "integer"}},
              "required": ["city", "population"], "additionalProperties": False}
    msgs = [{"role": "user", "content": "The largest city of Japan as JSON."}]
    got = client.chat.completions.create(model=server["model"], messages=msgs, temperature=0, max_tokens=60,
                                         response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}})
    want = embedded_llm.chat(msgs, SamplingParams(temperature=0, max_tokens=60, guided_json=schema))[0].outputs[0].text
    assert got.choices[0].message.content == want
    jsonschema.validate(json.loads(want), schema)
    obj = client.chat.completions.create(model=server["model"], messages=msgs, temperature=0, max_tokens=60,
                                         response_format={"type": "json_object"})
    text = obj.choices[0].message.content  # any object: it may run past max_tokens
    assert text.startswith("{") and (obj.choices[0].finish_reason == "length" or isinstance(json.loads(text), dict))
    extra = client.completions.create(model=server["model"], prompt="The answer is", temperature=0, max_tokens=8,
                                      extra_body={"guided_choice": ["yes", "no"]})
    assert extra.choices[0].text in ("yes", "no")


def test_guided_text_the_vocabulary_cannot_spell_is_a_400_not_a_500(server):
    """Issue 36: SmolLM2 has no token for the byte F1. Forced from the start ("\U00040a89") the request
    is refused at admission; met midway ("[ab]\U00040a89" after a or b) the request finishes with
    "error": a 400 for a non-streamed request, an error event then [DONE] in a stream. Either way
    the ordinary request sent beside it is served, and no KV block is left behind."""
    m = server["model"]
    beside = {}
    t = threading.Thread(target=lambda: beside.update(r=raw(server, "POST", "/v1/completions",
                                                            {"model": m, "prompt": PROMPTS[1], "max_tokens": 24, "temperature": 0})))
    t.start()
    cases = [("/v1/completions", {"prompt": "hi", "guided_regex": "\U00040a89"}, "the constraint forces"),
             ("/v1/completions", {"prompt": "Answer a or b:", "guided_regex": "[ab]\U00040a89"}, "cannot spell"),
             ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a or b?"}], "guided_regex": "[ab]\U00040a89"},
              "cannot spell")]
    for path, body, message in cases:
        status, payload = raw(server, "POST", path, {"model": m, "max_tokens": 8, "temperature": 0, **body})
        err = json.loads(payload)["error"]
        assert status == 400 and err["code"] == 400 and err["message"].startswith("guided_regex: ") and message in err["message"], payload
    for path, body, _ in cases[1:]:
        status, payload = raw(server, "POST", path, {"model": m, "max_tokens": 8, "temperature": 0, "stream": True, **body})
        events = [line[len("data: "):] for line in payload.decode().splitlines() if line.startswith("data: ")]
        assert status == 200 and events[-1] == "[DONE]", payload
        err = json.loads(events[-2])["error"]
        assert err["code"] == 400 and "cannot spell" in err["message"], payload
    t.join()
    status, payload = beside["r"]
    assert status == 200 and json.loads(payload)["choices"][0]["finish_reason"] in ("length", "stop"), payload
    assert blocks_in_use(server) == 0


def test_clients_that_disconnect_mid_stream_leave_no_blocks(server):
    """16 streaming clients read a few events and hang up; their requests are aborted at once."""
    def one(i):
        conn = http.client.HTTPConnection("127.0.0.1", server["port"], timeout=60)
        body = {"model": server["model"], "prompt": PROMPTS[i % 3], "max_tokens": 2000, "ignore_eos": True, "stream": True}
        conn.request("POST", "/v1/completions", body=json.dumps(body),
                     headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200
        for _ in range(3):
            r.fp.readline()
        conn.sock.close()  # gone mid-stream

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert blocks_in_use(server) == 0
    status, body = raw(server, "GET", "/metrics")
    assert status == 200 and b'specserve:kv_blocks_in_use 0.0' in body and b"specserve:time_to_first_token_seconds" in body


def test_a_shared_prefix_is_served_from_the_prefix_cache(server):
    def hits() -> float:
        body = raw(server, "GET", "/metrics")[1].decode()
        return float(next(ln.split()[-1] for ln in body.splitlines() if ln.startswith("specserve:prefix_cache_hits_total")))

    before = hits()
    prompt = "Notes on the quick brown fox. " * 30
    for end in ("It jumps", "It sleeps"):
        status, _ = raw(server, "POST", "/v1/completions", {"model": server["model"], "prompt": prompt + end, "max_tokens": 2})
        assert status == 200
    assert hits() - before >= 160  # the second prompt's first 10+ blocks of 16 tokens


def test_past_the_concurrency_limit_requests_get_429_not_a_crash(server):
    results = []

    def one():
        results.append(raw(server, "POST", "/v1/completions",
                           {"model": server["model"], "prompt": "x", "max_tokens": 60, "ignore_eos": True})[0])

    threads = [threading.Thread(target=one) for _ in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert set(results) <= {200, 429} and 429 in results and 200 in results
    assert blocks_in_use(server) == 0


hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies
json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False) | st.text(max_size=8),
                           lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=6)
FIELDS = ["prompt", "messages", "temperature", "top_p", "top_k", "n", "stop", "seed", "stream", "logprobs",
          "top_logprobs", "stream_options", "ignore_eos", "echo", "best_of", "model", "tokens", "add_special_tokens",
          "tools", "tool_choice", "parallel_tool_calls", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p",
          "min_tokens", "allowed_token_ids", "include_stop_str_in_output", "bad_words", "truncate_prompt_tokens"]
# lengths stay short (a fuzzed 2**40 would be a valid, hours-long request, not a malformed one)
lengths = st.one_of(st.integers(-3, 6), st.floats(-2, 6), st.text(max_size=3), st.booleans(), st.lists(st.integers(), max_size=2))
bodies = st.fixed_dictionaries({}, optional={**{f: json_values for f in FIELDS}, "max_tokens": lengths,
                                             "max_completion_tokens": lengths})


@hypothesis.settings(max_examples=60, deadline=None, derandomize=True,
                     suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture, hypothesis.HealthCheck.too_slow])
@hypothesis.given(body=bodies, path=st.sampled_from(["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"]),
                  base=st.sampled_from([{"max_tokens": 3}, {"prompt": "hi", "max_tokens": 3},
                                        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}]))
def test_fuzzed_bodies_never_get_a_5xx(server, body, path, base):
    status, payload = raw(server, "POST", path, {**base, **body})
    assert status < 500, payload
    if status >= 400:
        assert json.loads(payload)["error"]["code"] == status


def test_short_load_run_has_no_errors_and_leaves_no_blocks(server):
    """The CI-sized version of `python -m specserve_bench.load` (64 clients x 10 minutes is the command)."""
    from specserve_bench.load import run_load
    res = run_load(f"http://127.0.0.1:{server['port']}/v1", KEY, clients=16, seconds=15, hang_ups=16)
    assert res["errors"] == 0, res["error_kinds"]
    assert res["requests_ok"] >= 16 and res["hang_ups_started"] == 16 and res["kv_blocks_in_use_after"] == 0


def test_async_llm_streams_aborts_by_id_and_refuses_duplicate_ids(server, embedded_llm):
    import asyncio
    llm = server["llm"]
    greedy = SamplingParams(temperature=0, max_tokens=12)

    async def collect(rid=None, stop_after=None):
        deltas = []
        async for d in llm.generate(PROMPTS[0], greedy if stop_after is None else SamplingParams(max_tokens=500, ignore_eos=True),
                                    request_id=rid):
            deltas.append(d)
            if stop_after is not None and len(deltas) == stop_after:
                llm.abort(rid)
        return deltas

    deltas = asyncio.run(collect())
    want = embedded_llm.generate(PROMPTS[0], greedy)[0].outputs[0]
    assert [t for d in deltas for t in d.token_ids] == want.token_ids and "".join(d.text for d in deltas) == want.text
    assert [o for d in deltas for o in d.origins] == want.origins
    assert deltas[-1].finish_reason == want.finish_reason and all(not d.finished for d in deltas[:-1])
    aborted = asyncio.run(collect("mine", stop_after=3))
    assert aborted[-1].finish_reason == "abort" and len(aborted) < 50
    assert blocks_in_use(server) == 0

    async def duplicate():
        first = llm.generate(PROMPTS[0], SamplingParams(max_tokens=200, ignore_eos=True), request_id="dup")
        await first.__anext__()
        try:
            with pytest.raises(ValueError, match="already running"):
                await llm.generate(PROMPTS[0], greedy, request_id="dup").__anext__()
        finally:
            await first.aclose()  # leaving early aborts it

    asyncio.run(duplicate())
    assert blocks_in_use(server) == 0
