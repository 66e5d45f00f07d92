"""ollama's API (/api/chat, /api/generate, /api/tags, /api/ps, /api/show, /api/version) for the clients
that speak it (ollama's own libraries, LangChain's ChatOllama, Open WebUI's Ollama connection; what its
CLI needs besides, HEAD / and 64-digit digests, is answered, but the CLI has not been run against it).

A request is translated into the OpenAI request it means (protocol.py) and runs the same path as
/v1/chat/completions and /v1/completions (serving.py: the same checks, limits, metrics and aborts);
its answer comes back as ollama's objects, streamed (the default) as NDJSON lines. Errors are
ollama's {"error": "..."} with the status.

Where it differs from ollama: its sampling defaults are kept (temperature 0.8, top_k 40, top_p 0.9)
but not its repeat_penalty 1.1 over the last 64 tokens: a repeat_penalty given counts the whole
sequence, as vLLM's repetition_penalty does. No images or (deprecated) context; keep_alive is
accepted and ignored (the model stays loaded); num_ctx is the server's --max-model-len. A suffix is
fill-in-the-middle, as ollama's code-model templates render it (its system is dropped, as theirs do);
with raw it is refused, where ollama ignores it.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import time
from typing import Any, AsyncIterator, Optional

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ... import __version__
from ...types import StreamDelta
from ..errors import OLLAMA_PREFIX, ApiError, error_response
from ..protocol import ChatCompletionRequest
from ..serving import Serving
from .chat import ChatChoice
from .completions import CompletionChoice
from .translated import FillingCompletion, RequestError, answer, mapped, ndjson, read_json, validated, without_nulls

# ollama's options -> the OpenAI request's fields (vLLM's extras where OpenAI has none)
OPTIONS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "seed": "seed",
           "stop": "stop", "repeat_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
           "frequency_penalty": "frequency_penalty"}
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9}  # ollama's (api/types.go DefaultOptions)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def request_fields(body: dict, max_model_len: int) -> dict:
    """The OpenAI request's fields from ollama's options, format and stream (a null is as if unset)."""
    opts = body.get("options") or {}
    if not isinstance(opts, dict):
        raise RequestError(400, "options must be an object")
    opts = without_nulls(opts)
    out: dict[str, Any] = mapped(opts, OPTIONS, DEFAULTS)
    n = opts.get("num_predict")
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, (int, float)) or n != int(n):
            raise RequestError(400, f"num_predict must be an integer, got {n!r}")
        if 1 <= n < max_model_len:  # 0, -1 (ollama's default), -2 and past the context: until a stop or the context's end
            out["max_tokens"] = int(n)
    fmt = body.get("format")
    if fmt == "json":
        out["guided_json"] = {"type": "object"}
    elif isinstance(fmt, dict):
        out["guided_json"] = fmt
    elif fmt not in (None, ""):
        raise RequestError(400, 'format must be "json" or a JSON Schema')
    for name in ("images", "context", "template"):
        if body.get(name):
            raise RequestError(400, f"{name} is not supported")
    stream = body.get("stream")
    if stream is None:
        stream = True  # ollama streams unless told not to
    if not isinstance(stream, bool):
        raise RequestError(400, f"stream must be true or false, got {stream!r}")
    out.update(stream=stream, stream_options={"include_usage": True} if stream else None)
    return out


def router(s: Serving) -> APIRouter:
    r = APIRouter()

    def card(name: str) -> dict:
        # a placement's models are replicas elsewhere (cluster/router.py): no local file or engine to read
        eng = getattr(s.models[name], "engine", None)
        path = getattr(eng, "model_path", None) or ""
        files = [path] if os.path.isfile(path) else \
            [os.path.join(path, f) for f in sorted(os.listdir(path)) if f.endswith((".safetensors", ".bin"))] if path else []
        size = sum(os.path.getsize(f) for f in files)
        # ollama's digest names the model's blobs; its CLI prints the first 12 hex digits (and fails on fewer)
        key = "\0".join([name, path, str(size), *(str(os.path.getmtime(f)) for f in files)])
        return {"name": name, "model": name, "modified_at": _now(), "size": size,
                "digest": hashlib.sha256(key.encode()).hexdigest(),
                "details": {"format": "safetensors" if os.path.isdir(path) else "gguf",
                            "family": eng.arch.architecture if eng is not None else "", "parameter_size": "",
                            "quantization_level": ""}}

    @r.get("/api/version", include_in_schema=False)
    async def version():
        return {"version": __version__}

    @r.get("/api/tags", include_in_schema=False)
    async def tags():
        return {"models": [card(name) for name in s.models]}

    @r.get("/api/ps", include_in_schema=False)
    async def ps():
        # every served model stays loaded: expiry a century away, which ollama's CLI shows as "Forever"
        forever = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=36500)).isoformat()
        out = []
        for name, m in s.models.items():
            c = card(name)
            eng = getattr(m, "engine", None)
            on_gpu = eng is not None and eng.device.type == "cuda"
            out.append({**c, "expires_at": forever.replace("+00:00", "Z"), "size_vram": c["size"] if on_gpu else 0,
                        "context_length": m.max_model_len})
        return {"models": out}

    def model_of(body: dict) -> str:
        """The served model a body names (ollama's "name:latest" is its untagged name); 404 for another."""
        name = body.get("model") or body.get("name") or s.model_name
        if not isinstance(name, str):
            raise RequestError(400, "model must be a string")
        if name not in s.models and name.endswith(":latest") and name[:-len(":latest")] in s.models:
            name = name[:-len(":latest")]
        if name not in s.models:
            raise RequestError(404, f"model '{name}' not found")
        return name

    def failed(status: int, message: str, headers: Optional[dict] = None) -> JSONResponse:
        s.metrics.errors.labels(str(status)).inc()  # as the app's handlers count every failure
        return error_response(status, message, headers=headers, path=OLLAMA_PREFIX)

    @r.post("/api/show", include_in_schema=False)
    async def show(http: Request):
        try:
            name = model_of(await read_json(http))
        except RequestError as e:
            return failed(e.status, e.message)
        tok = s.models[name].tokenizer
        return {"template": tok.chat_template or "", "parameters": "", "modelfile": "", "details": card(name)["details"],
                "model_info": {"context_length": s.models[name].max_model_len},
                "capabilities": ["completion"] + (["tools"] if tok.takes_tools else [])
                + (["insert"] if tok.fim.can_infill else [])}

    # Not in /openapi.json: these are ollama's API, not the OpenAI one it describes.
    @r.post("/api/chat", include_in_schema=False)
    async def chat(http: Request):
        return await _run(http, chat=True)

    @r.post("/api/generate", include_in_schema=False)
    async def generate(http: Request):
        return await _run(http, chat=False)

    async def _run(http: Request, chat: bool):
        t0 = time.perf_counter_ns()
        try:
            body = await read_json(http)
            name = model_of(body)
            fields = {"model": name, **request_fields(body, s.models[name].max_model_len)}
            if not (body.get("messages") if chat else body.get("prompt")):  # ollama's way of loading a model
                return {"model": name, "created_at": _now(), "done": True, "done_reason": "load",
                        **({"message": {"role": "assistant", "content": ""}} if chat else {"response": ""})}
            if chat:
                messages = body["messages"]
                if isinstance(messages, list) and any(isinstance(m, dict) and m.get("images") for m in messages):
                    raise RequestError(400, "images are not supported")
                req = validated(ChatCompletionRequest, messages=messages, tools=body.get("tools"), **fields)
            elif not isinstance(body["prompt"], str):
                raise RequestError(400, "prompt must be a string")
            elif body.get("suffix"):  # fill in the middle (ollama's template: no system; "" is unset, as in Go)
                if body.get("raw"):
                    raise RequestError(400, "raw does not take a suffix (the suffix needs the model's template)")
                if not isinstance(body["suffix"], str):
                    raise RequestError(400, "suffix must be a string")
                req = validated(FillingCompletion, prompt=body["prompt"], suffix=body["suffix"], **fields)
            elif body.get("raw"):
                req = validated(FillingCompletion, prompt=body["prompt"], **fields)
            else:
                system = [{"role": "system", "content": body["system"]}] if body.get("system") else []
                req = validated(ChatCompletionRequest, messages=system + [{"role": "user", "content": body["prompt"]}],
                                **fields)
            s.check_common(req)
            slot, ids, params = await s.admit_and_prepare(req)
        except RequestError as e:
            return failed(e.status, e.message)
        except ApiError as e:
            return failed(e.status, e.message, e.headers)
        is_chat = isinstance(req, ChatCompletionRequest)
        reply = _Reply(name, chat, is_chat, t0)
        streams = [reply.timed(s.engine(req).generate(ids[0], params))]
        fmt = ChatChoice(s.token_text(req), req.tool_mode()) if is_chat else CompletionChoice(s.token_text(req))
        return await answer(s, http, slot, req, streams, s.new_choices(req, fmt, 1, ids), reply.line, reply.whole,
                            failed, "application/x-ndjson", ndjson)

    return r


def _object(arguments: Optional[str]) -> Any:
    """A call's arguments as ollama sends them: the object its JSON text holds (the text if it holds none)."""
    try:
        return json.loads(arguments or "{}")
    except ValueError:
        return arguments


def _reason(finish: Optional[str]) -> Optional[str]:
    """ollama's done_reason: stop or length (an answer of tool calls is a stop there)."""
    return "stop" if finish == "tool_calls" else finish


class _Reply:
    """OpenAI chunks or a whole response -> ollama's objects: a line per piece of text (chat: a
    message), then the last with done, done_reason and the counts and durations (nanoseconds)."""

    def __init__(self, model: str, chat: bool, from_chat: bool, t0: int):
        # chat: /api/chat (a message) or /api/generate (a response); from_chat: the OpenAI answer is chat's
        self.model, self.chat, self.from_chat, self.t0 = model, chat, from_chat, t0
        self.first: Optional[int] = None  # when the first token came
        self.reason: Optional[str] = None

    async def timed(self, stream: AsyncIterator[StreamDelta]) -> AsyncIterator[StreamDelta]:
        """The engine's deltas, the first token's time noted (ollama's prompt_eval_duration ends there);
        closing it closes the engine's stream (an abort)."""
        try:
            async for d in stream:
                if self.first is None and d.token_ids:
                    self.first = time.perf_counter_ns()
                yield d
        finally:
            await stream.aclose()

    def _body(self, text: str, calls: Optional[list] = None) -> dict:
        if not self.chat:
            return {"response": text}
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:  # OpenAI's calls carry their arguments as JSON text, ollama's as an object
            message["tool_calls"] = [{"function": {"name": c["function"].get("name", ""),
                                                   "arguments": _object(c["function"].get("arguments"))}}
                                     for c in calls]
        return {"message": message}

    def _done(self, usage: dict) -> dict:
        end = time.perf_counter_ns()
        first = self.first or end
        return {"done": True, "done_reason": self.reason or "stop", "total_duration": end - self.t0, "load_duration": 0,
                "prompt_eval_count": usage["prompt_tokens"], "prompt_eval_duration": first - self.t0,
                "eval_count": usage["completion_tokens"], "eval_duration": end - first}

    def line(self, chunk: dict) -> Optional[dict]:
        head = {"model": self.model, "created_at": _now()}
        if "error" in chunk:
            return {"error": chunk["error"]["message"]}
        if "usage" in chunk:
            return {**head, **self._body(""), **self._done(chunk["usage"])}
        choice = chunk["choices"][0]
        self.reason = _reason(choice["finish_reason"]) or self.reason
        delta = choice.get("delta") or {}
        text = delta.get("content") or "" if self.from_chat else choice.get("text", "")
        calls = delta.get("tool_calls")
        if not text and not calls:
            return None
        return {**head, **self._body(text, calls), "done": False}

    def whole(self, response: dict) -> dict:
        choice = response["choices"][0]
        self.reason = _reason(choice["finish_reason"])
        text = choice["message"]["content"] or "" if self.from_chat else choice["text"]
        calls = choice["message"].get("tool_calls") if self.from_chat else None
        return {"model": self.model, "created_at": _now(), **self._body(text, calls), **self._done(response["usage"])}
