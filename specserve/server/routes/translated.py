"""What the APIs translated into an OpenAI request share (ollama's /api/, llama-server's /infill): a
request error with its status, reading the JSON body, a completion that runs to the context's end by
default, and running the admitted request into that API's own stream or object. Each route says only
how its request maps (its fields, defaults) and how its answer looks."""
from __future__ import annotations

import json
from typing import Callable, Optional

import pydantic
from fastapi import Request

from ..errors import ApiError
from ..limits import SlotStreamingResponse
from ..protocol import CompletionRequest
from ..serving import Serving


class RequestError(Exception):
    """A request the translating route refuses, in that API's own error shape."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class FillingCompletion(CompletionRequest):
    """No length asked (ollama's num_predict -1, llama-server's n_predict -1): until a stop or the
    context's end."""
    fills_context = True


async def read_json(http: Request) -> dict:
    try:
        body = await http.json()
    except ValueError:
        raise RequestError(400, "the request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    return body


def validated(cls, **fields):
    """cls(**fields), a validation error as a RequestError naming the field."""
    try:
        return cls(**fields)
    except pydantic.ValidationError as e:
        err = e.errors()[0]
        raise RequestError(400, f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}") from None


def without_nulls(d: dict) -> dict:
    """A null is as if the field were unset (both APIs' clients send them for defaults)."""
    return {k: v for k, v in d.items() if v is not None}


def mapped(values: dict, names: dict[str, str], defaults: dict) -> dict:
    """The OpenAI request's fields from an API's own (names: its field -> OpenAI's), over the API's
    defaults. A null is as if unset, and a negative seed (ollama's and llama.cpp's default, -1) is none."""
    out = {names[k]: v for k, v in {**defaults, **without_nulls(values)}.items() if k in names}
    seed = out.get("seed")
    if isinstance(seed, (int, float)) and not isinstance(seed, bool) and seed < 0:
        del out["seed"]
    return out


async def answer(s: Serving, http: Request, slot, req, streams, choices, line: Callable[[dict], Optional[dict]],
                 whole: Callable[[dict], dict], failed: Callable[..., object], media_type: str,
                 frame: Callable[[dict], str]):
    """The admitted request run: streamed, each OpenAI chunk through line() (None: nothing to send) and
    framed (an NDJSON line, an SSE event); or whole, the OpenAI response through whole(). An error
    before the first byte comes back through failed(status, message, headers)."""
    if req.stream:
        async def out():
            async for chunk in s.chunks(req, streams, choices, {}):
                obj = line(chunk)
                if obj is not None:
                    yield frame(obj)
        return SlotStreamingResponse(out(), slot, media_type=media_type)
    try:
        response = await s.respond(http, slot, req, streams, choices, {}, "")
    except ApiError as e:  # a guided dead end, the engine gone: the API's own error object too
        return failed(e.status, e.message, e.headers)
    return whole(response) if isinstance(response, dict) else response


def ndjson(obj: dict) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"
