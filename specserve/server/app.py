"""The OpenAI-compatible HTTP server: /v1/completions, /v1/chat/completions (SSE streaming),
/v1/models, /health, /metrics, and the playground page at / (server/playground.html: a prompt box,
the answer streaming in coloured by token origin, live figures). Built on the public API only
(AsyncLLM, SamplingParams, specserve.origins).

    specserve serve --port 8000            then: OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="-")

Every failure is an OpenAI error object with its status: 400 bad request (malformed JSON and HTTP
included, a Host not allowed), 401 missing/wrong API key, 404 unknown model or route, 405 wrong
method (with Allow), 413 body too large, 429 too many requests in flight. A client that goes away
(streaming or not) has its requests aborted at once.
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
from fastapi.responses import HTMLResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..origins import OriginRuns
from ..types import SamplingParams, StreamDelta
from .config import ServerConfig
from .errors import ApiError, document_errors, error_response
from .limits import BodyLimit, InFlight, SlotStreamingResponse
from .metrics import ServerMetrics
from .protocol import ChatCompletionRequest, CompletionRequest, error_body
from .security import Guard, allowed_hosts, api_key


def build_app(llm, cfg: Optional[ServerConfig] = None) -> FastAPI:
    """llm: an AsyncLLM (the server owns nothing else of the engine)."""
    cfg = cfg or ServerConfig()
    metrics = ServerMetrics(llm)
    model_name = cfg.served_model_name or llm.model_name
    key, hosts = api_key(cfg), allowed_hosts(cfg)  # a bad --api-key-file fails here, before serving
    app = FastAPI(title="specserve", version="0.1.0")
    app.state.llm, app.state.cfg, app.state.metrics = llm, cfg, metrics
    in_flight = InFlight(cfg.max_concurrent_requests)
    document_errors(app)

    @app.exception_handler(ApiError)
    async def _api_error(_, e: ApiError):
        metrics.errors.labels(str(e.status)).inc()
        return error_response(e.status, e.message, e.type, e.param, e.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_, e: RequestValidationError):
        metrics.errors.labels("400").inc()
        errs = e.errors()
        first = errs[0] if errs else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        if first.get("type") == "json_invalid":
            return error_response(400, "the request body is not valid JSON")
        return error_response(400, f"{where or 'body'}: {first.get('msg', 'invalid')}", param=where or None)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_, e: StarletteHTTPException):
        metrics.errors.labels(str(e.status_code)).inc()
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return error_response(e.status_code, str(e.detail), kind, headers=e.headers)  # a 405's Allow

    @app.exception_handler(Exception)
    async def _unexpected(_, e: Exception):
        metrics.errors.labels("500").inc()
        return error_response(500, f"internal error: {type(e).__name__}: {str(e)[:200]}", "internal_server_error")

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

    def model_card() -> dict:
        return {"id": model_name, "object": "model", "created": int(time.time()), "owned_by": "specserve",
                "max_model_len": llm.max_model_len}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")  # :path: names with a slash (org/model), as vLLM serves them
    async def model(model_id: str):
        if model_id != model_name:
            raise ApiError(404, f"the model `{model_id}` does not exist (this server serves `{model_name}`)",
                           "not_found_error", "model")
        return model_card()

    @functools.lru_cache(maxsize=65536)
    def token_text(tid: int) -> str:
        return llm.tokenizer.decode([tid], skip_special_tokens=False)

    def check_common(body) -> None:
        if body.model is not None and body.model != model_name:
            raise ApiError(404, f"the model `{body.model}` does not exist (this server serves `{model_name}`)",
                           "not_found_error", "model")
        why = body.unsupported()
        if why:
            raise ApiError(400, why[0], param=why[1])
        if not 1 <= body.n <= cfg.max_n:
            raise ApiError(400, f"n must be in [1, {cfg.max_n}], got {body.n}", param="n")
        if body.best_of is not None and not body.n <= body.best_of <= cfg.max_n:
            raise ApiError(400, f"best_of must be in [n, {cfg.max_n}], got {body.best_of}", param="best_of")

    def make_params(body, prompts_ids: list[list[int]]) -> SamplingParams:
        try:
            logprobs = body.logprobs_param()
            longest = max(len(p) for p in prompts_ids)
            room = llm.max_model_len - longest
            # the rest of the context when not asked (chat, as vLLM), OpenAI's 16 for completions
            default = max(1, min(16, room) if isinstance(body, CompletionRequest) else room)
            params = body.sampling_params(default, logprobs)
            for ids in prompts_ids:
                llm.check(ids, params)
        except ValueError as e:
            raise ApiError(400, str(e).splitlines()[0]) from None
        asked = body.asked_max_tokens()
        if asked is not None and asked > room:  # as vLLM: refused, not silently cut at the context's end
            raise ApiError(400, f"this model's maximum context length is {llm.max_model_len} tokens, but {longest + asked} "
                                f"were requested ({longest} in the prompt, {asked} in the completion): lower max_tokens",
                           param="max_tokens")
        return params

    def prepare(body, prompts) -> tuple[list[list[int]], SamplingParams]:
        """Tokenise and check (run in a worker thread: a prompt of megabytes takes seconds)."""
        if isinstance(body, ChatCompletionRequest):
            try:
                conv = [{"role": m.role, "content": m.text()} for m in body.messages]
                ids = [llm.encode_chat(conv)]
            except ValueError as e:
                raise ApiError(400, f"messages: {str(e).splitlines()[0]}", param="messages") from None
        else:
            try:
                ids = [llm.encode(p) for p in prompts]
            except (TypeError, ValueError) as e:
                raise ApiError(400, f"prompt: {e}", param="prompt") from None
        return ids, make_params(body, ids)

    async def admit_and_prepare(body, prompts=None):
        """A slot in flight first (so a burst is refused before any work), then the prompt tokenised
        off the event loop (the tokenizer releases the GIL: /health and other streams go on)."""
        slot = in_flight.admit()
        try:
            ids, params = await asyncio.to_thread(prepare, body, prompts)
        except BaseException:
            slot.release()
            raise
        return slot, ids, params

    async def respond(http: Request, slot, streams, stream: bool, build, finish):
        """Run the admitted generation, its slot held until the response has been sent; a client gone
        mid-way aborts it."""
        if stream:
            async def events():
                async for chunk in build(streams):
                    yield f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n"
                yield "data: [DONE]\n\n"
            return SlotStreamingResponse(events(), slot, media_type="text/event-stream")
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
            slot.release()

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

    def dead_end(d: StreamDelta) -> Optional[ApiError]:
        """A sample that finished with "error" (its grammar met a dead end: engine/guided.py): the
        request's constraint asks for what the model cannot write, a 400 (vLLM finishes such a request
        with "error" too). A non-streamed response raises it; a stream sends it as an error event."""
        if d.finish_reason != "error":
            return None
        return ApiError(400, d.error or "guided generation reached a dead end")

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
        slot, ids, params = await admit_and_prepare(body, prompts)
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
                if (e := dead_end(d)) is not None:
                    metrics.errors.labels(str(e.status)).inc()
                    yield error_body(e.message, e.type, e.status, e.param)
                    return  # merged, finalised, aborts the other samples
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
                if (e := dead_end(d)) is not None:
                    raise e
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

        return await respond(http, slot, streams, body.stream, build, finish)

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
        slot, (ids,), params = await admit_and_prepare(body)
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        streams = [llm.generate(ids, params)]
        usage = lambda done: {"prompt_tokens": len(ids), "completion_tokens": done,  # noqa: E731
                              "total_tokens": len(ids) + done}
        head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model_name}

        async def build(streams):
            tr, started, runs = Tracker(len(ids)), set(), {}
            async for _, d in merged(streams):
                tr.see(d.index, d)
                if (e := dead_end(d)) is not None:
                    metrics.errors.labels(str(e.status)).inc()
                    yield error_body(e.message, e.type, e.status, e.param)
                    return  # merged, finalised, aborts the other samples
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
                if (e := dead_end(d)) is not None:
                    raise e
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

        return await respond(http, slot, streams, body.stream, build, finish)

    on_error = lambda status: metrics.errors.labels(str(status)).inc()  # noqa: E731
    return Guard(BodyLimit(app, cfg.max_body_bytes, on_error), key, hosts, on_error)
