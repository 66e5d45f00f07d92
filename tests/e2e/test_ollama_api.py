"""ollama's API (server/routes/ollama.py) with ollama's own client, request for request against
LLM.chat / LLM.generate on the embedded model: chat and generate, whole and streamed, raw prompts,
a system prompt, ollama's sampling defaults under a seed, format as a schema, the model list, and
errors as ollama's {"error": ...}, and `ollama ps`."""
import datetime
import json
import os

import pytest

from specserve import SamplingParams

from .serving import running

ollama = pytest.importorskip("ollama")
jsonschema = pytest.importorskip("jsonschema")

CONV = [{"role": "user", "content": "Name three colours."}]
GREEDY = {"temperature": 0, "num_predict": 16}


@pytest.fixture(scope="module")
def served():
    from specserve import AsyncLLM
    from specserve.server.app import build_app
    from specserve.server.config import ServerConfig
    llm = AsyncLLM(kv_cache_gib=0.25)
    with running(build_app(llm, ServerConfig())) as port, running(build_app(llm, ServerConfig(api_key="k"))) as guarded:
        yield ollama.Client(host=f"http://127.0.0.1:{port}", timeout=120), llm.model_name, guarded, port, llm.engine.model_path
    llm.shutdown()


def test_chat_whole_and_streamed_is_llm_chat(served, embedded_llm):
    client, model, *_ = served
    want = embedded_llm.chat(CONV, SamplingParams(temperature=0, max_tokens=16))[0]
    got = client.chat(model=model, messages=CONV, options=GREEDY)
    assert got.message.role == "assistant" and got.message.content == want.outputs[0].text
    assert got.done and got.done_reason == "length" and got.eval_count == 16
    assert got.prompt_eval_count == len(want.prompt_token_ids) and got.eval_duration > 0 and got.total_duration > 0
    parts = list(client.chat(model=model, messages=CONV, options=GREEDY, stream=True))
    assert "".join(p.message.content for p in parts) == want.outputs[0].text
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True] and parts[-1].eval_count == 16


def test_generate_templated_raw_and_with_a_system_prompt(served, embedded_llm):
    client, model, *_ = served
    greedy = SamplingParams(temperature=0, max_tokens=16)
    want = embedded_llm.chat(CONV, greedy)[0].outputs[0].text
    assert client.generate(model=model, prompt=CONV[0]["content"], options=GREEDY).response == want
    system = [{"role": "system", "content": "Answer in French."}]
    want = embedded_llm.chat(system + CONV, greedy)[0].outputs[0].text
    assert client.generate(model=model, prompt=CONV[0]["content"], system=system[0]["content"], options=GREEDY).response == want
    want = embedded_llm.generate("def add(a, b):", greedy)[0].outputs[0].text
    parts = list(client.generate(model=model, prompt="def add(a, b):", raw=True, options=GREEDY, stream=True))
    assert "".join(p.response for p in parts) == want and parts[-1].done
    loaded = client.generate(model=model, prompt="")  # ollama's way of loading a model
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""


def test_ollamas_sampling_defaults_under_a_seed(served, embedded_llm):
    """Unset options take ollama's defaults (temperature 0.8, top_k 40, top_p 0.9): a seeded request
    is LLM.chat's with those."""
    client, model, *_ = served
    want = embedded_llm.chat(CONV, SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=3, max_tokens=24))[0]
    got = client.chat(model=model, messages=CONV, options={"seed": 3, "num_predict": 24})
    assert got.message.content == want.outputs[0].text
    other = client.chat(model=model, messages=CONV, options={"seed": 3, "num_predict": 24, "temperature": 1.5, "top_k": 0})
    assert other.message.content != want.outputs[0].text


def test_format_as_a_schema_is_guided(served):
    client, model, *_ = served
    schema = {"type": "object", "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
              "required": ["colour"], "additionalProperties": False}
    got = client.chat(model=model, messages=CONV, format=schema, options={"temperature": 0, "num_predict": 40})
    jsonschema.validate(json.loads(got.message.content), schema)


def test_models_and_errors(served):
    import requests
    client, model, guarded, port, served_file = served
    listed = client.list().models
    assert [m.model for m in listed] == [model]
    assert listed[0].size == os.path.getsize(served_file) and listed[0].details.family == "llama"  # SmolLM2's GGUF
    assert len(listed[0].digest) == 64 and int(listed[0].digest, 16) >= 0  # ollama's CLI prints digest[:12]
    running = client.ps().models  # `ollama ps`: the served model, loaded for good, on the CPU
    assert [(m.model, m.size, m.digest, m.size_vram) for m in running] == [(model, listed[0].size, listed[0].digest, 0)]
    assert running[0].expires_at.year - datetime.datetime.now().year >= 99
    assert running[0].context_length == client.show(model).modelinfo["context_length"]
    assert requests.head(f"http://127.0.0.1:{port}/", timeout=30).status_code == 200  # ollama's CLI asks this first
    assert "completion" in client.show(model).capabilities
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="nope", messages=CONV)
    assert e.value.status_code == 404 and "nope" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model=model, messages=CONV, options={"num_predict": 1.5})
    assert e.value.status_code == 400 and "num_predict" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model=model, messages=[{**CONV[0], "images": ["aGk="]}])
    assert e.value.status_code == 400 and "images" in e.value.error
    loaded = client.chat(model=f"{model}:latest", messages=[])  # ollama's load request, under the tagged name
    assert loaded.done_reason == "load" and loaded.message.content == ""
    with pytest.raises(ollama.ResponseError) as e:  # the embedded model's template lists no tools
        client.chat(model=model, messages=CONV, tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])
    assert e.value.status_code == 400 and "tools" in e.value.error
    for body in ({"model": ["x"], "messages": CONV}, {"model": model, "prompt": ["a", "b"]}, b"{", [1]):
        r = requests.post(f"http://127.0.0.1:{port}/api/generate", data=body if isinstance(body, bytes) else json.dumps(body),
                          timeout=30)
        assert r.status_code == 400 and isinstance(r.json()["error"], str), r.text
    nulls = {"model": model, "messages": CONV, "stream": None, "options": {"temperature": None, "seed": 3, "num_predict": 24}}
    r = requests.post(f"http://127.0.0.1:{port}/api/chat", data=json.dumps(nulls), timeout=60)  # null: unset
    lines = [json.loads(x) for x in r.text.splitlines()]
    assert len(lines) > 2 and lines[-1]["done"]  # streamed, as ollama's default
    seeded = client.chat(model=model, messages=CONV, options={"seed": 3, "num_predict": 24})
    assert "".join(x["message"]["content"] for x in lines) == seeded.message.content  # temperature: ollama's default
    base = f"http://127.0.0.1:{guarded}"
    r = requests.get(f"{base}/api/tags", timeout=30)  # the API key guards /api/ as /v1/, in ollama's shape there
    assert r.status_code == 401 and isinstance(r.json()["error"], str) and "API key" in r.json()["error"], r.text
    assert requests.get(f"{base}/api/tags", headers={"Authorization": "Bearer k"}, timeout=30).status_code == 200
    r = requests.get(f"{base}/v1/models", timeout=30)
    assert r.status_code == 401 and isinstance(r.json()["error"], dict)  # OpenAI's shape on /v1/
    for method, path, status in (("get", "/api/nope", 404), ("get", "/api/chat", 405)):  # FastAPI's own refusals
        r = getattr(requests, method)(f"http://127.0.0.1:{port}{path}", timeout=30)
        assert r.status_code == status and isinstance(r.json()["error"], str), r.text
    r = requests.post(f"http://127.0.0.1:{port}/api/generate", data=b"x" * (5 * 2**20), timeout=60)  # over 4 MiB
    assert r.status_code == 413 and isinstance(r.json()["error"], str), r.text
    with pytest.raises(ollama.ResponseError) as e:  # ollama's client reads the string as the error
        ollama.Client(host=base, timeout=30).list()
    assert e.value.status_code == 401 and "API key" in e.value.error
