"""The OpenAI-compatible HTTP server: /v1/completions, /v1/chat/completions (SSE streaming),
/v1/models, /tokenize and /detokenize (vLLM's), ollama's /api/chat, /api/generate and /api/tags,
llama-server's /infill (fill-in-the-middle for code editors), /health, /metrics, and the playground
page at /. Built on the public API only
(AsyncLLM, SamplingParams, specserve.origins).

    specserve serve --port 8000            then: OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="-")

This module wires the app (as vLLM's api_server): the routes (routes/), what the generating ones
share (serving.py, choices.py), the error handlers and the ASGI layers around it all. Every failure
is an OpenAI error object (ollama's {"error": "..."} under /api/) with its status: 400 bad request (malformed JSON and HTTP included, a Host
not allowed), 401 missing/wrong API key, 404 unknown model or route, 405 wrong method (with Allow),
413 body too large, 429 too many requests in flight. A client that goes away (streaming or not) has
its requests aborted at once.
"""
from __future__ import annotations

from typing import Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from .config import ServerConfig
from .errors import ApiError, document_errors, error_response
from .limits import BodyLimit
from .metrics import ServerMetrics
from .routes import admin, chat, completions, infill, ollama, tokens
from .security import Guard, allowed_hosts, api_key
from .serving import Serving


def build_app(llm, cfg: Optional[ServerConfig] = None):
    """llm: an AsyncLLM (the server owns nothing else of the engine). Returns the ASGI app: FastAPI
    inside the body limit, inside the host and API key checks."""
    cfg = cfg or ServerConfig()
    metrics = ServerMetrics(llm)
    model_name = cfg.served_model_name or llm.model_name
    key, hosts = api_key(cfg), allowed_hosts(cfg)  # a bad --api-key-file fails here, before serving
    app = FastAPI(title="specserve", version="0.1.0")
    serving = Serving(llm, cfg, metrics, model_name)
    app.state.llm, app.state.cfg, app.state.metrics, app.state.serving = llm, cfg, metrics, serving
    document_errors(app)
    add_error_handlers(app, metrics)
    # in this order: /openapi.json lists the operations as they are included
    for routes in (admin, completions, chat, tokens, ollama, infill):
        app.include_router(routes.router(serving))

    on_error = lambda status: metrics.errors.labels(str(status)).inc()  # noqa: E731
    return Guard(BodyLimit(JsonBodies(app), cfg.max_body_bytes, on_error), key, hosts, on_error)


class JsonBodies:
    """Pure ASGI middleware: a POST body is read as JSON whatever its declared type. `curl -d '{...}'`
    sends form-urlencoded, which FastAPI would not parse ("body: Input should be a valid dictionary");
    llama.cpp's server and ollama read such requests as JSON, and so does this one. A body that is not
    JSON then gets "the request body is not valid JSON"."""

    JSON = (b"content-type", b"application/json")

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-type"]
            declared = next((v for k, v in scope.get("headers", []) if k.lower() == b"content-type"), b"")
            if not declared.split(b";")[0].strip().lower().endswith(b"json"):
                scope = {**scope, "headers": headers + [self.JSON]}
        return await self.app(scope, receive, send)


def add_error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
    """Every failure FastAPI or a route raises answered as OpenAI's error object (ollama's under /api/),
    and counted by status."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError):
        metrics.errors.labels(str(e.status)).inc()
        return error_response(e.status, e.message, e.type, e.param, e.headers, path=request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError):  # pydantic's 422 is OpenAI's 400, naming the field
        metrics.errors.labels("400").inc()
        errs = e.errors()
        first = errs[0] if errs else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        if first.get("type") == "json_invalid":
            return error_response(400, "the request body is not valid JSON", path=request.url.path)
        return error_response(400, f"{where or 'body'}: {first.get('msg', 'invalid')}", param=where or None,
                              path=request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException):
        metrics.errors.labels(str(e.status_code)).inc()
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return error_response(e.status_code, str(e.detail), kind, headers=e.headers, path=request.url.path)  # a 405's Allow

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, e: Exception):
        metrics.errors.labels("500").inc()
        return error_response(500, f"internal error: {type(e).__name__}: {str(e)[:200]}", "internal_server_error",
                              path=request.url.path)
