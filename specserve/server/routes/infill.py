"""llama.cpp's /infill: fill-in-the-middle for code editors (llama.vscode, llama.vim and the plugins
written against llama-server).

The body's input_prefix, input_suffix, input_extra (the repository's other files, [{"filename",
"text"}]) and prompt (text typed at the cursor) become the FIM prompt llama.cpp's format_prompt_infill
builds (Tokenizer.encode_infill, loading/infill.py, its limits from a batch of 2,048 tokens as
llama-server's default); then the request runs the path /v1/completions runs (serving.py: the same
checks, in-flight limit, metrics, aborts and API key). The answer is llama.cpp's /completion object
(content, stop, stop_type, tokens_predicted, tokens_evaluated, timings), streamed as SSE events of
the same keys without a [DONE].

llama-server's sampling defaults hold (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05; n_predict
-1: until a stop or the context's end). n_predict 0 is llama.vscode's warm-up: the prompt is computed
(and so cached for the next request's prefix) and nothing is returned. Accepted and ignored:
cache_prompt (prefix caching is the engine's), samplers, n_indent, t_max_prompt_ms,
t_max_predict_ms, response_fields.
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any, AsyncIterator, Optional

import pydantic
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ...types import StreamDelta
from ..errors import ApiError
from ..limits import SlotStreamingResponse
from ..protocol import CompletionRequest
from ..serving import Serving
from .completions import CompletionChoice

N_BATCH = 2048  # llama-server's default batch: the FIM part is fitted into one (format_prompt_infill)
# llama-server's fields -> the OpenAI request's, and its defaults (common/common.h common_params_sampling)
FIELDS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p", "seed": "seed",
          "stop": "stop", "repeat_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
          "frequency_penalty": "frequency_penalty"}
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}


class InfillError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class _Filling(CompletionRequest):
    """No n_predict (llama.cpp's -1): until a stop or the context's end."""
    fills_context = True


def request_fields(body: dict, max_model_len: int) -> tuple[dict, int]:
    """(the OpenAI request's fields, n_predict) from llama-server's: a null is as if unset."""
    out: dict[str, Any] = {FIELDS[k]: v for k, v in {**DEFAULTS, **body}.items() if k in FIELDS and v is not None}
    if isinstance(out.get("seed"), int) and not isinstance(out["seed"], bool) and out["seed"] < 0:
        del out["seed"]  # llama.cpp's -1 (its default): a random seed
    n = body.get("n_predict")
    if n is None:
        n = -1
    if isinstance(n, bool) or not isinstance(n, int):
        raise InfillError(400, f"n_predict must be an integer, got {n!r}")
    if n == 0:  # the warm-up: compute (and cache) the prompt, say nothing
        out["max_tokens"] = 1
    elif 0 < n < max_model_len:
        out["max_tokens"] = n
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InfillError(400, f"stream must be true or false, got {stream!r}")
    return {**out, "stream": stream, "stream_options": {"include_usage": True} if stream else None}, n


def files_of(body: dict) -> list[tuple[str, str]]:
    extra = body.get("input_extra")
    if extra is None:
        return []
    if not isinstance(extra, list):
        raise InfillError(400, '"input_extra" must be an array of {"filename": string, "text": string}')
    out = []
    for chunk in extra:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise InfillError(400, 'extra_context chunk must contain a "text" field with a string value')
        name = chunk.get("filename", "tmp")
        if not isinstance(name, str):
            raise InfillError(400, 'extra_context chunk\'s "filename" field must be a string')
        out.append((name, chunk["text"]))
    return out


def router(s: Serving) -> APIRouter:
    r = APIRouter()

    def failed(status: int, message: str, headers: Optional[dict] = None) -> JSONResponse:
        """llama-server's error object."""
        s.metrics.errors.labels(str(status)).inc()
        kind = {501: "not_supported_error", 404: "not_found_error"}.get(status, "invalid_request_error" if status < 500
                                                                         else "server_error")
        return JSONResponse({"error": {"code": status, "message": message, "type": kind}}, status_code=status,
                            headers=headers)

    # Not in /openapi.json: llama-server's API, not the OpenAI one it describes.
    @r.post("/infill", include_in_schema=False)
    async def infill(http: Request):
        t0 = time.perf_counter()
        try:
            body = await _json(http)
            name = body.get("model") or s.model_name  # llama-server serves one model and reads no name
            if name not in s.models:
                raise s.unknown_model(name)
            llm = s.models[name]
            if not llm.tokenizer.fim.can_infill:
                raise InfillError(501, "Infill is not supported by this model: its vocabulary has no FIM "
                                       f"{', '.join(llm.tokenizer.fim.missing())} token")
            for key in ("input_prefix", "input_suffix"):
                if not isinstance(body.get(key), str):
                    raise InfillError(400, f'"{key}" is required' if key not in body else f'"{key}" must be a string')
            if not isinstance(body.get("prompt", ""), str):
                raise InfillError(400, '"prompt" must be a string')
            fields, n_predict = request_fields(body, llm.max_model_len)
            ids = await asyncio.to_thread(
                llm.tokenizer.encode_infill, body["input_prefix"], body["input_suffix"], prompt=body.get("prompt", ""),
                files=files_of(body), n_batch=N_BATCH, n_ctx=llm.max_model_len, n_predict=max(0, n_predict))
            try:
                req = _Filling(model=name, prompt=ids, **fields)
            except pydantic.ValidationError as e:
                err = e.errors()[0]
                raise InfillError(400, f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}") from None
            s.check_common(req)
            slot, ids, params = await s.admit_and_prepare(req, req.prompts())
        except InfillError as e:
            return failed(e.status, e.message)
        except ApiError as e:
            return failed(e.status, e.message, e.headers)
        reply = _Reply(name, len(ids[0]), n_predict == 0, t0)
        streams = [reply.timed(llm.generate(ids[0], params))]
        choices = s.new_choices(req, CompletionChoice(s.token_text(req)), 1, ids)
        if req.stream:
            async def events():
                async for chunk in s.chunks(req, streams, choices, {}):
                    event = reply.event(chunk)
                    if event is not None:
                        yield f"data: {json.dumps(event, ensure_ascii=False)}\n\n"
            return SlotStreamingResponse(events(), slot, media_type="text/event-stream")
        try:
            whole = await s.respond(http, slot, req, streams, choices, {}, "")
        except ApiError as e:
            return failed(e.status, e.message, e.headers)
        return reply.whole(whole) if isinstance(whole, dict) else whole

    return r


async def _json(http: Request) -> dict:
    try:
        body = await http.json()
    except ValueError:
        raise InfillError(400, "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise InfillError(400, "the request body must be a JSON object")
    return body


class _Reply:
    """OpenAI chunks or a whole response -> llama-server's /completion objects: an event per piece of
    text, then the last with stop, stop_type and timings."""

    def __init__(self, model: str, prompt_n: int, warm_up: bool, t0: float):
        self.model, self.prompt_n, self.warm_up, self.t0 = model, prompt_n, warm_up, t0
        self.first: Optional[float] = None  # when the first token came: the prompt's time ends there
        self.finish: Optional[str] = None  # the choice's finish_reason and stop_reason, from its last chunk
        self.stop_reason: Any = None

    async def timed(self, stream: AsyncIterator[StreamDelta]) -> AsyncIterator[StreamDelta]:
        try:
            async for d in stream:
                if self.first is None and d.token_ids:
                    self.first = time.perf_counter()
                yield d
        finally:
            await stream.aclose()

    def _last(self, text: str, finish: Optional[str], stop_reason, usage: dict) -> dict:
        end = time.perf_counter()
        first = self.first or end
        predicted = 0 if self.warm_up else usage["completion_tokens"]
        prompt_ms, predicted_ms = (first - self.t0) * 1e3, (end - first) * 1e3
        stop_type = "limit" if finish == "length" else "word" if isinstance(stop_reason, str) else "eos"
        return {"index": 0, "content": text, "tokens": [], "id_slot": 0, "stop": True, "model": self.model,
                "tokens_predicted": predicted, "tokens_evaluated": self.prompt_n, "has_new_line": "\n" in text,
                "truncated": False, "stop_type": "limit" if self.warm_up else stop_type,
                "stopping_word": stop_reason if isinstance(stop_reason, str) else "",
                "tokens_cached": self.prompt_n + predicted,
                "timings": {"prompt_n": self.prompt_n, "prompt_ms": prompt_ms,
                            "prompt_per_token_ms": prompt_ms / max(1, self.prompt_n),
                            "prompt_per_second": self.prompt_n / max(1e-9, prompt_ms / 1e3),
                            "predicted_n": predicted, "predicted_ms": predicted_ms,
                            "predicted_per_token_ms": predicted_ms / max(1, predicted),
                            "predicted_per_second": predicted / max(1e-9, predicted_ms / 1e3)}}

    def event(self, chunk: dict) -> Optional[dict]:
        if "error" in chunk:
            return chunk
        if "usage" in chunk:
            return self._last("", self.finish, self.stop_reason, chunk["usage"])
        choice = chunk["choices"][0]
        if choice["finish_reason"] is not None:
            self.finish, self.stop_reason = choice["finish_reason"], choice.get("stop_reason")
        text = "" if self.warm_up else choice.get("text", "")
        if not text:
            return None
        return {"index": 0, "content": text, "tokens": [], "stop": False, "id_slot": -1,
                "tokens_evaluated": self.prompt_n}

    def whole(self, response: dict) -> dict:
        choice = response["choices"][0]
        return self._last("" if self.warm_up else choice["text"], choice["finish_reason"], choice.get("stop_reason"),
                          response["usage"])
