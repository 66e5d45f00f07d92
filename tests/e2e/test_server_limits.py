"""The server's limits hold for every kind of request (issue 36): a streaming burst past
--max-concurrent-requests gets 429s; a 4 MB prompt is tokenised off the event loop (/health answers
within 200 ms meanwhile); max_tokens past the context is a 400, as in vLLM; logit_bias is honoured and
the chat-only parameters are refused on /v1/completions by name; /v1/models/{id}, 405's Allow, 413
for a chunked body, malformed HTTP as OpenAI JSON, an OpenAPI schema that documents 400, and the
cpu_threads metric."""
import http.client
import json
import re
import socket
import threading
import time

import pytest

from .serving import running

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")
CONTEXT = 512  # a short context: requests at its edge stay cheap


@pytest.fixture(scope="module")
def llm():
    from specserve import AsyncLLM
    llm = AsyncLLM(kv_cache_gib=0.25, max_model_len=CONTEXT)
    yield llm
    llm.shutdown()


def serve(llm, **cfg):
    from specserve.server.app import build_app
    from specserve.server.config import ServerConfig
    return running(build_app(llm, ServerConfig(**cfg)))


@pytest.fixture(scope="module")
def port(llm):
    with serve(llm, max_concurrent_requests=4, max_n=4, max_body_bytes=64 * 1024) as p:
        yield p


def raw(port, method, path, body=None, headers=None, timeout=120):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
    conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
    r = conn.getresponse()
    out = r.status, r.read(), dict(r.getheaders())
    conn.close()
    return out


def idle_blocks(llm, timeout=60.0) -> int:
    deadline = time.time() + timeout
    while time.time() < deadline and (llm.stats.running or llm.stats.waiting or llm.stats.kv_blocks_used):
        time.sleep(0.1)
    return llm.stats.kv_blocks_used


def in_flight_after(port, timeout: float) -> float:
    """/metrics' count of HTTP requests in flight, polled until it is 0 or `timeout` has passed."""
    deadline = time.time() + timeout
    while True:
        _, text, _ = raw(port, "GET", "/metrics")
        count = float(re.search(rb"^specserve:http_requests_in_flight (\S+)$", text, re.M).group(1))
        if count == 0 or time.time() > deadline:
            return count
        time.sleep(0.05)


def test_a_streaming_burst_past_the_limit_gets_429s(llm, port):
    """16 streams at once against a limit of 4: each client holds its stream open until every client
    has its answer, so no slot frees before the burst is over; exactly 4 stream, 12 get 429."""
    clients = 16
    answered = threading.Barrier(clients, timeout=120)
    statuses, errors = [], []

    def one(i):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        try:
            conn.request("POST", "/v1/completions", headers={"Content-Type": "application/json"}, body=json.dumps(
                {"prompt": f"Count to {i}:", "max_tokens": CONTEXT // 2, "ignore_eos": True, "stream": True}))
            r = conn.getresponse()
            statuses.append(r.status)
            if r.status == 429:
                errors.append(json.loads(r.read())["error"])
            answered.wait()
        finally:
            conn.sock.close() if conn.sock else None  # hang up mid-stream

    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert sorted(statuses) == [200] * 4 + [429] * 12, statuses
    assert all(e["type"] == "rate_limit_error" and e["code"] == 429 for e in errors), errors
    assert idle_blocks(llm) == 0, llm.stats
    # the hung-up streams give their slots back (each as its response unwinds, a moment after the engine
    # dropped its request): the in-flight gauge comes down to 0, and a full set of 4 is admitted again
    assert in_flight_after(port, 60.0) == 0
    again = []
    threads = [threading.Thread(target=lambda: again.append(raw(port, "POST", "/v1/completions",
                                                                {"prompt": "x", "max_tokens": 2})[0])) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert again == [200] * 4


def test_health_answers_within_200ms_while_a_4mb_prompt_is_rejected(llm):
    """Tokenising 4 MB takes seconds; it runs in a worker thread (the tokenizer lets go of the GIL),
    so /health keeps answering. The prompt is refused (past the context) with a 400."""
    prompt = "def f(x):\n    return x * 2  # words\n" * 110_000  # ~4.0 MB, ~1.6M tokens
    with serve(llm) as p:  # the default body limit (4 MiB) takes it
        assert len(prompt) < 4 * 2**20 - 100
        result = {}
        big = threading.Thread(target=lambda: result.update(r=raw(p, "POST", "/v1/completions",
                                                                  {"prompt": prompt, "max_tokens": 1})))
        big.start()
        took = []
        while big.is_alive() and len(took) < 200:
            t0 = time.perf_counter()
            status, _, _ = raw(p, "GET", "/health", timeout=10)
            took.append(time.perf_counter() - t0)
            assert status == 200
            time.sleep(0.02)
        big.join(60)
    status, body, _ = result["r"]
    assert status == 400 and "context is" in json.loads(body)["error"]["message"]
    assert len(took) >= 5, "the 4 MB prompt was refused too fast to probe /health meanwhile"
    assert max(took) < 0.2, f"/health took {max(took):.3f} s while the 4 MB prompt was tokenised"


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": [1] * 500, "max_tokens": 13}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 10**12}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": CONTEXT}),
])
def test_max_tokens_beyond_the_context_is_a_400(port, path, body):
    status, payload, _ = raw(port, "POST", path, body)
    err = json.loads(payload)["error"]
    assert status == 400 and err["param"] == "max_tokens" and f"context length is {CONTEXT}" in err["message"]


def test_max_tokens_up_to_the_context_is_served(port):
    status, payload, _ = raw(port, "POST", "/v1/completions", {"prompt": [1] * 500, "max_tokens": 12, "ignore_eos": True})
    assert status == 200 and json.loads(payload)["usage"]["completion_tokens"] == 12


@pytest.mark.parametrize("field, value", [("temperature", -1), ("top_p", 0)])
def test_a_bad_value_names_its_param(port, field, value):
    status, payload, _ = raw(port, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2, field: value})
    err = json.loads(payload)["error"]
    assert status == 400 and err["param"] == field and field in err["message"], err


def test_stream_options_without_stream_is_a_400(port):
    status, payload, _ = raw(port, "POST", "/v1/completions",
                             {"prompt": "hi", "max_tokens": 2, "stream_options": {"include_usage": True}})
    err = json.loads(payload)["error"]
    assert status == 400 and err["param"] == "stream_options" and "stream is true" in err["message"]


def test_a_json_body_sent_as_a_form_is_read_as_json(port):
    """`curl -d '{...}'` declares form-urlencoded: served as llama.cpp and ollama serve it; a real form
    is then not valid JSON, and says so."""
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    status, payload, _ = raw(port, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2}, headers=form)
    assert status == 200 and json.loads(payload)["usage"]["completion_tokens"] == 2
    status, payload, _ = raw(port, "POST", "/v1/completions", "prompt=hi&max_tokens=2", headers=form)
    assert status == 400 and json.loads(payload)["error"]["message"] == "the request body is not valid JSON"


def test_chat_without_max_tokens_gets_what_the_cache_holds_not_a_400():
    """A cache smaller than the context (as 1 GiB is for the 1.5B's 32k): chat without max_tokens is
    served up to what the cache holds, while asking for more than that is still refused."""
    from specserve import AsyncLLM
    small = AsyncLLM(kv_cache_gib=0.01)  # 14 blocks of 16 tokens; the embedded model's context is 8192
    try:
        assert small.cache_tokens == 224 < small.max_model_len
        msgs = [{"role": "user", "content": "Count from 1 to 1000, one number a line."}]
        with serve(small) as p:
            status, payload, _ = raw(p, "POST", "/v1/chat/completions", {"messages": msgs, "temperature": 0,
                                                                          "ignore_eos": True})
            out = json.loads(payload)
            assert status == 200, out
            assert out["choices"][0]["finish_reason"] == "length"
            assert out["usage"]["prompt_tokens"] + out["usage"]["completion_tokens"] == small.cache_tokens
            status, payload, _ = raw(p, "POST", "/v1/chat/completions", {"messages": msgs, "max_tokens": 500})
            assert status == 400 and "raise kv_cache_gib" in json.loads(payload)["error"]["message"]
    finally:
        small.shutdown()


@pytest.mark.parametrize("name, value", [("functions", [{"name": "f", "parameters": {}}]), ("tool_choice", "auto"),
                                         ("parallel_tool_calls", False), ("response_format", {"type": "json_object"}),
                                         ("tools", [])])
def test_chat_parameters_on_completions_are_refused_by_name(port, name, value):
    status, payload, _ = raw(port, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2, name: value})
    err = json.loads(payload)["error"]
    assert status == 400 and err["param"] == name and name in err["message"]


def test_logit_bias_steers_the_tokens(llm, port):
    tok = llm.tokenizer
    plain = json.loads(raw(port, "POST", "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 4,
                                                             "temperature": 0})[1])["choices"][0]["text"]
    first = tok.encode(plain, add_special_tokens=False)[0]
    forced = tok.encode(" blue", add_special_tokens=False)[0]
    status, payload, _ = raw(port, "POST", "/v1/completions", {
        "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0,
        "logit_bias": {str(first): -100, str(forced): 100}})
    assert status == 200
    assert json.loads(payload)["choices"][0]["text"] == tok.decode([forced] * 4)
    # chat too, sampled: a +100 bias makes the token certain
    status, payload, _ = raw(port, "POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 3, "seed": 1,
        "logit_bias": {str(forced): 100}})
    assert status == 200 and json.loads(payload)["choices"][0]["message"]["content"] == tok.decode([forced] * 3)


@pytest.mark.parametrize("bias, words", [({"x": 1}, "token ids"), ({"1": 101}, "[-100, 100]"),
                                         ({"99999999": 1}, "vocabulary")])
def test_bad_logit_bias_is_a_400(port, bias, words):
    status, payload, _ = raw(port, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2, "logit_bias": bias})
    assert status == 400 and words in json.loads(payload)["error"]["message"]


def test_models_retrieve_and_unknown_models(llm, port):
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", max_retries=0, timeout=60)
    card = client.models.retrieve(llm.model_name)
    assert card.id == llm.model_name and card.id in [m.id for m in client.models.list().data]
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-9")


def test_a_wrong_method_gets_405_with_allow(port):
    status, payload, headers = raw(port, "POST", "/v1/models", {})
    assert status == 405 and headers.get("allow") == "GET" and json.loads(payload)["error"]["code"] == 405


def test_an_over_limit_chunked_body_gets_413(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    chunk = b'{"prompt": "' + b"x" * 16 * 1024
    conn.request("POST", "/v1/completions", body=iter([chunk] * 8), encode_chunked=True,
                 headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
    r = conn.getresponse()
    assert r.status == 413 and json.loads(r.read())["error"]["code"] == 413
    conn.close()
    # under the limit a chunked body is served as any other
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/completions", body=iter([b'{"prompt": "hi", ', b'"max_tokens": 2}']), encode_chunked=True,
                 headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
    r = conn.getresponse()
    assert r.status == 200 and json.loads(r.read())["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("request_bytes", [b"NOT HTTP AT ALL\r\n\r\n", b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n"])
def test_malformed_http_gets_an_openai_error_object(port, request_bytes):
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(request_bytes)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"application/json" in head.lower()
    err = json.loads(body)["error"]
    assert err["code"] == 400 and err["message"].startswith("malformed HTTP request")


def test_the_openapi_schema_documents_400_not_422(port):
    status, payload, _ = raw(port, "GET", "/openapi.json")
    schema = json.loads(payload)
    ops = [op for path in schema["paths"].values() for op in path.values()]
    assert status == 200 and not any("422" in op.get("responses", {}) for op in ops)
    assert "400" in schema["paths"]["/v1/completions"]["post"]["responses"] and "Error" in schema["components"]["schemas"]


def test_cpu_threads_metric_counts_the_engines_threads(port):
    raw(port, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2})
    body = raw(port, "GET", "/metrics")[1].decode()
    assert float(next(ln.split()[-1] for ln in body.splitlines() if ln.startswith("specserve:cpu_threads"))) >= 1
