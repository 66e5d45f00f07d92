"""Fill-in-the-middle on Qwen2.5-Coder-0.5B (whose vocabulary has FIM tokens), through each API that
takes it, request for request against LLM.generate on Tokenizer.encode_infill's prompt: OpenAI's
/v1/completions `suffix` (the official client), ollama's /api/generate `suffix` (its own client) and
llama-server's /infill (the body llama.vscode sends), whole and streamed; the generation ends where
llama.cpp ends it (<|endoftext|>), and a model without FIM tokens (the embedded SmolLM2) is refused."""
import json

import httpx
import pytest

from specserve import LLM, SamplingParams
from specserve.loading import embedded_model_path
from specserve.loading.gguf_file import GGUFFile
from specserve.loading.tokenizer import Tokenizer
from specserve.server.routes.infill import repository_prompt

from .serving import running

openai = pytest.importorskip("openai")

PREFIX, SUFFIX = "def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n"
FILES = [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}]


def serve(path, **cfg):
    from specserve import AsyncLLM
    from specserve.server.app import build_app
    from specserve.server.config import ServerConfig
    llm = AsyncLLM(path, kv_cache_gib=0.25, activations="int8")
    return llm, build_app(llm, ServerConfig(**cfg))


@pytest.fixture(scope="module")
def qwen(pulled):
    """(the served port, an LLM of the same model and mode beside it, the served model's name, the
    context /infill fits the other files into)."""
    path = pulled("qwen2.5-coder-0.5b")
    llm, app = serve(path)
    with running(app) as port:
        yield port, LLM(path, kv_cache_gib=0.25, activations="int8"), llm.model_name, min(llm.max_model_len, llm.cache_tokens)
    llm.shutdown()


@pytest.fixture(scope="module")
def embedded():
    llm, app = serve(None, api_key="k")
    with running(app) as port:
        yield port, llm.model_name
    llm.shutdown()


def middle(llm, ids, max_tokens=32):
    return llm.generate([ids], SamplingParams(temperature=0, max_tokens=max_tokens))[0].outputs[0]


def test_generation_ends_on_llama_cpps_end_of_generation_tokens(pulled):
    """The ids that end a generation: the header's EOS, the turn and document ends by their text and
    FIM's pad, repo and file separators (llama.cpp's llama-vocab.cpp), compared with llama.cpp's own
    set where llama-cpp-python is installed, less its rule for PaddleOCR's "</s>", which matches a
    plain-text token of Qwen's vocabulary (HF's generation config does not stop on it either)."""
    qwen = pulled("qwen2.5-coder-0.5b")
    for path, want in ((qwen, [151645, 151643, 151662, 151663, 151664]), (embedded_model_path(), [2, 0, 4])):
        fields = GGUFFile(path).fields
        tok = Tokenizer.from_gguf_fields(fields, path)
        assert tok.eos_token_ids == want  # the header's EOS first (training and grammars take it)
        try:
            import llama_cpp
        except ImportError:
            continue
        ll = llama_cpp.Llama(path, vocab_only=True, verbose=False)
        vocab = llama_cpp.llama_model_get_vocab(ll.model)
        plain_s = {i for i, t in enumerate(fields["tokenizer.ggml.tokens"]) if t == "</s>" and fields["tokenizer.ggml.token_type"][i] == 1}
        assert sorted(want) == [i for i in range(ll.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, i) and i not in plain_s]


def test_code_is_plain_text_in_a_fim_prompt(qwen):
    """A file that spells a special token holds its characters, as llama.cpp tokenises prefix and
    suffix (parse_special off), not the token: here <|endoftext|> would end the prompt's document."""
    llm = qwen[1]
    prefix = 'EOT = "<|endoftext|>"  # <|fim_middle|>\n' + PREFIX
    ids = llm.tokenizer.encode_infill(prefix, SUFFIX)
    assert [ids.count(t) for t in (151643, 151659, 151660, 151661)] == [0, 1, 1, 1]
    assert llm.tokenizer.decode(ids, skip_special_tokens=False) == f"<|fim_prefix|>{prefix}<|fim_suffix|>{SUFFIX}<|fim_middle|>"
    assert llm.tokenizer.encode(prefix, add_special_tokens=False).count(151643) == 1  # encode() reads the spelling
    try:
        import llama_cpp
    except ImportError:
        return
    ll = llama_cpp.Llama(llm.engine.model_path, vocab_only=True, verbose=False)
    assert ids[1:ids.index(151661)] == ll.tokenize(prefix.encode(), add_bos=False, special=False)


def test_completions_with_a_suffix_fill_the_middle(qwen):
    port, llm, model, _ = qwen
    ids = llm.tokenizer.encode_infill(PREFIX, SUFFIX)
    assert llm.tokenizer.decode(ids, skip_special_tokens=False) == f"<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>"
    want = middle(llm, ids)
    assert want.text.startswith("a + b") and want.finish_reason == "stop" and want.token_ids[-1] == 151643
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=120)
    got = client.completions.create(model=model, prompt=[PREFIX, PREFIX], suffix=SUFFIX, temperature=0, max_tokens=32)
    assert [c.text for c in got.choices] == [want.text] * 2 and got.choices[0].finish_reason == "stop"
    assert got.usage.prompt_tokens == 2 * len(ids)
    parts = client.completions.create(model=model, prompt=PREFIX, suffix=SUFFIX, temperature=0, max_tokens=32, stream=True)
    assert "".join(c.choices[0].text for c in parts if c.choices) == want.text
    # OpenAI's usage.prompt_tokens_details: the prompt's whole 16-token blocks found in the prefix cache
    again = client.completions.create(model=model, prompt=PREFIX, suffix=SUFFIX, temperature=0, max_tokens=1)
    assert len(ids) > 16 and again.usage.prompt_tokens_details.cached_tokens == (len(ids) - 1) // 16 * 16
    for body, param in (({"prompt": PREFIX, "suffix": SUFFIX, "echo": True}, "echo"),
                        ({"prompt": [1, 2, 3], "suffix": SUFFIX}, "prompt"),
                        ({"prompt": PREFIX, "suffix": SUFFIX, "truncate_prompt_tokens": 4}, "truncate_prompt_tokens")):
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"model": model, **body}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_ollamas_generate_with_a_suffix_fills_the_middle(qwen):
    ollama = pytest.importorskip("ollama")
    port, llm, model, _ = qwen
    want = middle(llm, llm.tokenizer.encode_infill(PREFIX, SUFFIX)).text
    client = ollama.Client(host=f"http://127.0.0.1:{port}", timeout=120)
    opts = {"temperature": 0, "num_predict": 32}
    got = client.generate(model=model, prompt=PREFIX, suffix=SUFFIX, options=opts)
    assert got.response == want and got.done_reason == "stop"
    assert "".join(p.response for p in client.generate(model=model, prompt=PREFIX, suffix=SUFFIX, options=opts,
                                                      stream=True)) == want
    assert "insert" in client.show(model).capabilities
    with pytest.raises(ollama.ResponseError, match="raw does not take a suffix"):
        client.generate(model=model, prompt=PREFIX, suffix=SUFFIX, raw=True)


def test_llama_servers_infill_is_the_repository_layout_filled(qwen):
    """/infill as llama.vscode calls it: the other files first in Qwen2.5-Coder's repository layout
    (as llama.cpp's format_prompt_infill writes it), the prompt typed at the cursor after the prefix;
    llama.cpp's /completion object back, whole and as SSE events; n_predict 0 warms the cache and
    answers nothing."""
    port, llm, model, n_ctx = qwen
    files = [(f["filename"], f["text"]) for f in FILES]
    ids = repository_prompt(llm.tokenizer, PREFIX, SUFFIX, "a", files, n_ctx=n_ctx)
    assert llm.tokenizer.decode(ids, skip_special_tokens=False) == (
        f"<|repo_name|>myproject\n<|file_sep|>util.py\n{FILES[0]['text']}<|file_sep|>filename\n"
        f"<|fim_prefix|>{PREFIX}a<|fim_suffix|>{SUFFIX}<|fim_middle|>")
    want = middle(llm, ids)
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": FILES, "prompt": "a", "n_predict": 32,
            "temperature": 0, "cache_prompt": True, "t_max_prompt_ms": 500, "n_indent": None}
    url = f"http://127.0.0.1:{port}/infill"
    got = httpx.post(url, json=body, timeout=120).json()
    stop_type = {"stop": "eos", "length": "limit"}[want.finish_reason]
    assert got["content"] == want.text and got["stop"] and got["stop_type"] == stop_type
    assert got["tokens_evaluated"] == got["timings"]["prompt_n"] + got["timings"]["cache_n"] == len(ids)
    assert got["tokens_predicted"] == got["timings"]["predicted_n"] == len(want.token_ids)
    assert got["has_new_line"] == ("\n" in want.text)
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=120) as r:
        events = [json.loads(line[len("data: "):]) for line in r.iter_lines() if line.startswith("data: ")]
    assert "".join(e["content"] for e in events) == want.text
    assert [e["stop"] for e in events] == [False] * (len(events) - 1) + [True] and events[-1]["stop_type"] == stop_type
    warm = httpx.post(url, json={**body, "n_predict": 0, "input_prefix": PREFIX + "x"}, timeout=120).json()
    assert warm["content"] == "" and warm["tokens_predicted"] == 0
    # the request it warmed finds its prompt in the prefix cache, all but the last (partial) block
    again = httpx.post(url, json={**body, "n_predict": 1, "input_prefix": PREFIX + "x"}, timeout=120).json()
    n, cached = again["tokens_evaluated"], again["timings"]["cache_n"]
    assert warm["tokens_evaluated"] == n and cached % 16 == 0 and n - 16 <= cached < n
    assert again["timings"]["prompt_n"] == n - cached
    picked = httpx.post(url, json={**body, "n_predict": 2, "response_fields": ["content", "timings/predicted_n"]},
                        timeout=120).json()
    assert picked == {"content": want.text[:len(picked["content"])], "timings/predicted_n": 2}
    for bad, message in (({"input_suffix": ""}, '"input_prefix" is required'), ({**body, "input_extra": "x"}, "input_extra"),
                         ({**body, "input_extra": [{"filename": "a"}]}, '"text"'), ({**body, "n_predict": "8"}, "n_predict"),
                         ({**body, "samplers": 3}, "samplers"), ({**body, "n_indent": "4"}, "n_indent"),
                         ({**body, "t_max_predict_ms": "500"}, "t_max_predict_ms"), ({**body, "prompt": 0}, '"prompt"'),
                         ({**body, "response_fields": "content"}, "response_fields")):
        r = httpx.post(url, json=bad, timeout=60)
        assert r.status_code == 400 and message in r.json()["error"]["message"], r.text


def test_infills_samplers_and_indentation_stop_are_llama_servers(qwen):
    """`samplers` names the steps that run (none: the full distribution at temperature 1, whatever
    temperature says), and n_indent ends the middle at a line indented less than it."""
    port, llm, model, n_ctx = qwen
    url = f"http://127.0.0.1:{port}/infill"
    ids = repository_prompt(llm.tokenizer, PREFIX, SUFFIX, n_ctx=n_ctx)
    full = SamplingParams(temperature=1.0, top_k=-1, top_p=1.0, min_p=0.0, seed=3, max_tokens=12)
    want = llm.generate([ids], full)[0].outputs[0].text
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 12, "seed": 3}
    assert httpx.post(url, json={**body, "temperature": 0, "samplers": []}, timeout=120).json()["content"] == want
    assert httpx.post(url, json={**body, "temperature": 0, "samplers": ""}, timeout=120).json()["content"] == want
    greedy = middle(llm, ids).text  # "a + b\n\nprint(...)": the empty line is indented less than 4
    got = httpx.post(url, json={**body, "temperature": 0, "n_predict": 32, "n_indent": 4}, timeout=120).json()
    assert "\n" in greedy and got["stop_type"] == "limit" and got["content"].endswith("\n")
    assert greedy.startswith(got["content"]) and len(got["content"]) < len(greedy)


def test_a_model_without_fim_tokens_is_refused_and_infill_is_guarded(embedded):
    port, model = embedded
    key = {"Authorization": "Bearer k"}
    r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"model": model, "prompt": "a", "suffix": "b"},
                   headers=key, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix" and "fill-in-the-middle" in r.text
    url = f"http://127.0.0.1:{port}/infill"
    assert httpx.post(url, json={"input_prefix": "a", "input_suffix": "b"}, timeout=60).status_code == 401
    r = httpx.post(url, json={"input_prefix": "a", "input_suffix": "b"}, headers=key, timeout=60)
    assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
