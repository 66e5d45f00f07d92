"""The OpenAI-compatible HTTP server: /v1/completions, /v1/chat/completions (SSE streaming),
/v1/models, /health, /metrics, and the playground page at / (server/playground.html: a prompt box,
the answer streaming in coloured by token origin, live figures). Built on the public API only
(AsyncLLM, SamplingParams, specserve.origins).

    specserve serve --port 8000            then: OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="-")

Every failure is an OpenAI error object with its status: 400 bad request (malformed JSON included),
401 missing/wrong API key, 404 unknown model or route, 413 body too large, 429 too many requests in
flight. A client that goes away (streaming or not) has its requests aborted at once.
"""
from __future__ import annotations

import asyncio
import functools
import json
import os
import time
import uuid
from typing import AsyncIterator, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..origins import OriginRuns
from ..types import SamplingParams, StreamDelta
from .config import ServerConfig
from .metrics import ServerMetrics
from .protocol import ChatCompletionRequest, CompletionRequest, error_body


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: Optional[str] = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type_, param


def _error(status: int, message: str, type_: str, param: Optional[str] = None) -> JSONResponse:
    return JSONResponse(error_body(message, type_, status, param), status_code=status)


class _Limits:
    """Pure ASGI middleware: body size (413) and API key (401) before any parsing."""

    def __init__(self, app, cfg: ServerConfig, metrics: ServerMetrics):
        self.app, self.cfg, self.metrics = app, cfg, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if self.cfg.api_key and path.startswith("/v1/"):
            if headers.get("authorization", "") != f"Bearer {self.cfg.api_key}":
                self.metrics.errors.labels("401").inc()
                return await _error(401, "missing or wrong API key (Authorization: Bearer KEY)",
                                    "authentication_error")(scope, receive, send)
        declared = headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.cfg.max_body_bytes):
            self.metrics.errors.labels("413").inc()
            return await _error(413, f"request body over {self.cfg.max_body_bytes} bytes", "invalid_request_error")(
                scope, receive, send)
        seen = 0
        limit = self.cfg.max_body_bytes

        async def counted():  # chunked bodies declare no length: count as they arrive
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:
                    raise ApiError(413, f"request body over {limit} bytes")
            return msg

        return await self.app(scope, counted, send)


def build_app(llm, cfg: Optional[ServerConfig] = None) -> FastAPI:
    """llm: an AsyncLLM (the server owns nothing else of the engine)."""
    cfg = cfg or ServerConfig()
    metrics = ServerMetrics(llm)
    model_name = cfg.served_model_name or llm.model_name
    app = FastAPI(title="specserve", version="0.1.0")
    app.state.llm, app.state.cfg, app.state.metrics = llm, cfg, metrics
    in_flight = 0

    @app.exception_handler(ApiError)
    async def _api_error(_, e: ApiError):
        metrics.errors.labels(str(e.status)).inc()
        return _error(e.status, e.message, e.type, e.param)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_, e: RequestValidationError):
        metrics.errors.labels("400").inc()
        errs = e.errors()
        first = errs[0] if errs else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        if first.get("type") == "json_invalid":
            return _error(400, "the request body is not valid JSON", "invalid_request_error")
        return _error(400, f"{where or 'body'}: {first.get('msg', 'invalid')}", "invalid_request_error", where or None)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_, e: StarletteHTTPException):
        metrics.errors.labels(str(e.status_code)).inc()
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return _error(e.status_code, str(e.detail), kind)

    @app.exception_handler(Exception)
    async def _unexpected(_, e: Exception):
        metrics.errors.labels("500").inc()
        return _error(500, f"internal error: {type(e).__name__}: {str(e)[:200]}", "internal_server_error")

    with open(os.path.join(os.path.dirname(__file__), "playground.html"), encoding="utf-8") as f:
        playground = f.read()

    @app.get("/", include_in_schema=False)
    async def page():
        return HTMLResponse(playground)

    @app.get("/health")
    async def health():
        return Response(status_code=200)

    @app.get("/metrics")
    async def prometheus():
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": int(time.time()),
                                            "owned_by": "specserve", "max_model_len": llm.max_model_len}]}

    @functools.lru_cache(maxsize=65536)
    def token_text(tid: int) -> str:
        return llm.tokenizer.decode([tid], skip_special_tokens=False)

    def check_common(body) -> None:
        if body.model is not None and body.model != model_name:
            raise ApiError(404, f"the model `{body.model}` does not exist (this server serves `{model_name}`)",
                           "not_found_error", "model")
        why = body.unsupported()
        if why:
            raise ApiError(400, why)
        if not 1 <= body.n <= cfg.max_n:
            raise ApiError(400, f"n must be in [1, {cfg.max_n}], got {body.n}", param="n")
        if body.best_of is not None and not body.n <= body.best_of <= cfg.max_n:
            raise ApiError(400, f"best_of must be in [n, {cfg.max_n}], got {body.best_of}", param="best_of")

    def make_params(body, prompts_ids: list[list[int]]) -> SamplingParams:
        try:
            logprobs = body.logprobs_param()
            longest = max(len(p) for p in prompts_ids)
            default = 16 if isinstance(body, CompletionRequest) else max(1, llm.max_model_len - longest)
            params = body.sampling_params(default, logprobs)
            for ids in prompts_ids:
                llm.check(ids, params)
        except ValueError as e:
            raise ApiError(400, str(e).splitlines()[0]) from None
        return params

    async def admitted(http: Request, streams, stream: bool, build, finish):
        """Run the generation under the in-flight limit; a client gone mid-way aborts it."""
        nonlocal in_flight
        if in_flight >= cfg.max_concurrent_requests:
            raise ApiError(429, f"{in_flight} requests in flight (the limit is {cfg.max_concurrent_requests}); retry later",
                           "rate_limit_error")
        if stream:
            async def events():
                # Counted from the first byte: a response never started (client gone before) never
                # runs this generator, so counting earlier would leak a slot.
                nonlocal in_flight
                in_flight += 1
                try:
                    async for chunk in build(streams):
                        yield f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n"
                    yield "data: [DONE]\n\n"
                finally:
                    in_flight -= 1
            return StreamingResponse(events(), media_type="text/event-stream")
        in_flight += 1
        try:
            task = asyncio.ensure_future(finish(streams))
            while True:
                done, _ = await asyncio.wait({task}, timeout=0.5)
                if done:
                    return task.result()
                if await http.is_disconnected():
                    task.cancel()
                    return Response(status_code=499)
        finally:
            in_flight -= 1

    async def merged(streams: list[AsyncIterator[StreamDelta]]) -> AsyncIterator[tuple[int, StreamDelta]]:
        """(prompt index, delta) from every prompt's stream as they come; closing it closes them all."""
        if len(streams) == 1:
            try:
                async for d in streams[0]:
                    yield 0, d
            finally:
                await streams[0].aclose()
            return
        q: asyncio.Queue = asyncio.Queue()

        async def pump(i, s):
            try:
                async for d in s:
                    await q.put((i, d))
            except BaseException as e:
                await q.put((i, e))
                raise
            finally:
                await q.put((i, None))

        tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
        open_ = len(streams)
        try:
            while open_:
                i, d = await q.get()
                if d is None:
                    open_ -= 1
                elif isinstance(d, BaseException):
                    raise d
                else:
                    yield i, d
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def origin_runs(body, runs: dict, c: int, d: StreamDelta) -> dict:
        """For a streamed choice when the request asks (return_origins): its new tokens' origins and their
        text in runs of one origin; else {}."""
        if not body.return_origins or d.origins is None:
            return {}
        stream = runs.setdefault(c, OriginRuns(llm.tokenizer))
        return {"origins": list(d.origins),
                "origin_runs": [[t, o.value] for t, o in stream.push(d.token_ids, d.origins)]}

    class Tracker:
        """Latency metrics of one HTTP request as its deltas pass."""

        def __init__(self, prompt_tokens: int):
            self.t0 = time.perf_counter()
            self.first: Optional[float] = None
            self.last: dict[int, float] = {}
            self.tokens = 0
            metrics.prompt_tokens.inc(prompt_tokens)

        def see(self, choice: int, d: StreamDelta):
            now = time.perf_counter()
            if d.token_ids:
                if self.first is None:
                    self.first = now
                    metrics.ttft.observe(now - self.t0)
                if choice in self.last:
                    metrics.itl.observe(now - self.last[choice])
                self.last[choice] = now
                self.tokens += len(d.token_ids)
                metrics.generation_tokens.inc(len(d.token_ids))
            if d.finished:
                metrics.finished.labels(d.finish_reason).inc()

        def done(self):
            now = time.perf_counter()
            metrics.e2e.observe(now - self.t0)
            if self.first is not None and self.tokens > 1:
                metrics.tpot.observe((max(self.last.values()) - self.first) / (self.tokens - 1))

    # --- /v1/completions ------------------------------------------------------------------------
    def completion_logprobs(d: StreamDelta, offset: int) -> Optional[dict]:
        if d.logprobs is None:
            return None
        toks = [token_text(t) for t in d.token_ids]
        offsets, o = [], offset
        for t in toks:
            offsets.append(o)
            o += len(t)
        tops = [{token_text(i): lp for i, lp in top.items()} for top in d.top_logprobs] if d.top_logprobs else None
        return {"tokens": toks, "token_logprobs": d.logprobs, "top_logprobs": tops, "text_offset": offsets}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, http: Request):
        check_common(body)
        prompts = body.prompts()
        if not 1 <= len(prompts) <= cfg.max_prompts:
            raise ApiError(400, f"prompt must hold 1 to {cfg.max_prompts} prompts", param="prompt")
        try:
            ids = [llm.encode(p) for p in prompts]
        except (TypeError, ValueError) as e:
            raise ApiError(400, f"prompt: {e}", param="prompt") from None
        params = make_params(body, ids)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        n = params.n
        streams = [llm.generate(p, params) for p in ids]
        prompt_tokens = sum(len(p) for p in ids)
        usage = lambda done: {"prompt_tokens": prompt_tokens, "completion_tokens": done,  # noqa: E731
                              "total_tokens": prompt_tokens + done}
        head = {"id": rid, "object": "text_completion", "created": created, "model": model_name}

        async def build(streams):
            tr, offsets, runs = Tracker(prompt_tokens), {}, {}
            async for pi, d in merged(streams):
                c = pi * n + d.index
                tr.see(c, d)
                lp = completion_logprobs(d, offsets.get(c, 0))
                offsets[c] = offsets.get(c, 0) + len(d.text)
                extra = origin_runs(body, runs, c, d)  # every delta: its tokens move the detokenizer on
                if d.text or d.finished or lp is not None or extra.get("origins"):
                    yield {**head, "choices": [{"index": c, "text": d.text, "logprobs": lp, "finish_reason": d.finish_reason,
                                                "stop_reason": d.stop_reason, **extra}]}
            tr.done()
            if body.stream_options is not None and body.stream_options.include_usage:
                yield {**head, "choices": [], "usage": usage(tr.tokens)}

        async def finish(streams):
            tr = Tracker(prompt_tokens)
            # (with a deadline a prompt may answer with fewer than n samples: its choices keep pi * n + rank)
            choices = {}
            async for pi, d in merged(streams):
                c = pi * n + d.index
                tr.see(c, d)
                ch = choices.setdefault(c, {"index": c, "text": "", "logprobs": None, "finish_reason": None,
                                            "stop_reason": None})
                lp = completion_logprobs(d, len(ch["text"]))
                if lp is not None:
                    if ch["logprobs"] is None:
                        ch["logprobs"] = {"tokens": [], "token_logprobs": [], "top_logprobs": [] if lp["top_logprobs"] is not None
                                          else None, "text_offset": []}
                    for k in ("tokens", "token_logprobs", "text_offset"):
                        ch["logprobs"][k] += lp[k]
                    if lp["top_logprobs"] is not None:
                        ch["logprobs"]["top_logprobs"] += lp["top_logprobs"]
                ch["text"] += d.text
                if d.finished:
                    ch["finish_reason"], ch["stop_reason"] = d.finish_reason, d.stop_reason
            tr.done()
            return {**head, "choices": [choices[i] for i in sorted(choices)], "usage": usage(tr.tokens)}

        return await admitted(http, streams, body.stream, build, finish)

    # --- /v1/chat/completions -------------------------------------------------------------------
    def chat_logprobs(d: StreamDelta) -> Optional[dict]:
        if d.logprobs is None:
            return None
        content = []
        for j, (t, lp) in enumerate(zip(d.token_ids, d.logprobs)):
            s = token_text(t)
            tops = d.top_logprobs[j] if d.top_logprobs else {}
            content.append({"token": s, "logprob": lp, "bytes": list(s.encode()),
                            "top_logprobs": [{"token": token_text(i), "logprob": v, "bytes": list(token_text(i).encode())}
                                             for i, v in tops.items()]})
        return {"content": content}

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, http: Request):
        check_common(body)
        try:
            conv = [{"role": m.role, "content": m.text()} for m in body.messages]
            ids = llm.encode_chat(conv)
        except ValueError as e:
            raise ApiError(400, f"messages: {str(e).splitlines()[0]}", param="messages") from None
        params = make_params(body, [ids])
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        streams = [llm.generate(ids, params)]
        usage = lambda done: {"prompt_tokens": len(ids), "completion_tokens": done,  # noqa: E731
                              "total_tokens": len(ids) + done}
        head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model_name}

        async def build(streams):
            tr, started, runs = Tracker(len(ids)), set(), {}
            async for _, d in merged(streams):
                tr.see(d.index, d)
                delta = {}
                if d.index not in started:
                    started.add(d.index)
                    delta["role"] = "assistant"
                if d.text:
                    delta["content"] = d.text
                lp = chat_logprobs(d)
                extra = origin_runs(body, runs, d.index, d)  # every delta: its tokens move the detokenizer on
                if delta or d.finished or lp is not None or extra.get("origins"):
                    yield {**head, "choices": [{"index": d.index, "delta": delta, "logprobs": lp,
                                                "finish_reason": d.finish_reason, "stop_reason": d.stop_reason, **extra}]}
            tr.done()
            if body.stream_options is not None and body.stream_options.include_usage:
                yield {**head, "choices": [], "usage": usage(tr.tokens)}

        async def finish(streams):
            tr = Tracker(len(ids))
            choices = {}
            async for _, d in merged(streams):
                tr.see(d.index, d)
                ch = choices.setdefault(d.index, {"index": d.index, "message": {"role": "assistant", "content": ""},
                                                  "logprobs": None, "finish_reason": None, "stop_reason": None})
                ch["message"]["content"] += d.text
                lp = chat_logprobs(d)
                if lp is not None:
                    ch["logprobs"] = {"content": (ch["logprobs"] or {"content": []})["content"] + lp["content"]}
                if d.finished:
                    ch["finish_reason"], ch["stop_reason"] = d.finish_reason, d.stop_reason
            tr.done()
            return {**head, "object": "chat.completion", "choices": [choices[i] for i in sorted(choices)],
                    "usage": usage(tr.tokens)}

        return await admitted(http, streams, body.stream, build, finish)

    return _Limits(app, cfg, metrics)
