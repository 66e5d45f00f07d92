"""What /v1/completions and /v1/chat/completions share around their choices (vLLM's serving_engine):
checking a request against this server, tokenising it off the event loop, admitting it, merging its
prompts' streams, and running it into an SSE stream or one JSON response while its metrics are
observed. The routes (routes/completions.py, routes/chat.py) only say what differs: the prompts, the
response's id and object, and their ChoiceFormat.
"""
from __future__ import annotations

import asyncio
import functools
import json
from typing import AsyncIterator, Optional

from fastapi import Request
from fastapi.responses import Response

from ..origins import OriginRuns
from ..types import EngineDeadError, SamplingParams, StreamDelta, truncate_prompt
from .choices import ChoiceFormat, Choices
from .config import ServerConfig
from .errors import ApiError
from .limits import InFlight, SlotStreamingResponse
from .metrics import RequestTracker, ServerMetrics
from .protocol import ChatCompletionRequest, error_body


class Serving:
    """The engines (AsyncLLMs, or a placement's ModelReplicas: used through AsyncLLM's public surface
    only) as the generating routes see them, by the model name clients send."""

    def __init__(self, llm, cfg: ServerConfig, metrics: ServerMetrics, model_name: str):
        self.cfg, self.metrics = cfg, metrics
        # a placement (cluster/router.py) serves several models by name; an AsyncLLM one
        self.models = dict(getattr(llm, "models", None) or {model_name: llm})
        self.model_name = next(iter(self.models))  # the default: a request that names no model gets it
        self.in_flight = InFlight(cfg.max_concurrent_requests)
        metrics.requests_in_flight.set_function(lambda: self.in_flight.count)
        # a token's text, for logprobs: the same few thousand tokens come back in every response
        self._token_text = {name: functools.lru_cache(maxsize=65536)(
            lambda tid, tok=m.tokenizer: tok.decode([tid], skip_special_tokens=False)) for name, m in self.models.items()}

    def unknown_model(self, name: str) -> ApiError:
        return ApiError(404, f"the model `{name}` does not exist (this server serves `{'`, `'.join(self.models)}`)",
                        "not_found_error", "model")

    def name(self, body) -> str:
        """The served model a request asks for (checked by check_common)."""
        return self.model_name if body.model is None else body.model

    def engine(self, body):
        return self.models[self.name(body)]

    def token_text(self, body):
        return self._token_text[self.name(body)]

    def check_model(self, body) -> None:
        """A model this server does not serve: 404 (no model named: the default)."""
        if body.model is not None and body.model not in self.models:
            raise self.unknown_model(body.model)

    def check_common(self, body) -> None:
        """What both endpoints refuse before any work: another model, unsupported values, n / best_of out of range."""
        cfg = self.cfg
        self.check_model(body)
        why = body.unsupported()
        if why:
            raise ApiError(400, why[0], param=why[1])
        if not 1 <= body.n <= cfg.max_n:
            raise ApiError(400, f"n must be in [1, {cfg.max_n}], got {body.n}", param="n")
        if body.best_of is not None and not body.n <= body.best_of <= cfg.max_n:
            raise ApiError(400, f"best_of must be in [n, {cfg.max_n}], got {body.best_of}", param="best_of")

    def make_params(self, body, prompts_ids: list[list[int]]) -> SamplingParams:
        llm = self.engine(body)
        try:
            logprobs = body.logprobs_param()
            longest = max(len(p) for p in prompts_ids)
            room = llm.max_model_len - longest
            # the rest of the context when not asked (chat, as vLLM), OpenAI's 16 for completions; never
            # more than the KV cache holds (1 GiB holds 18.7k tokens of the 1.5B, whose context is 32k):
            # a chat client that leaves max_tokens out is served, not refused for a length it never asked
            fits = llm.cache_tokens - longest
            default = max(1, min(room, fits) if body.fills_context else min(16, room, fits))
            if body.clamps_length and body.max_tokens is not None and body.max_tokens > min(room, fits):
                body = body.model_copy(update={"max_tokens": max(1, min(room, fits))})  # to the context's end
            params = body.sampling_params(default, logprobs)
            for ids in prompts_ids:
                llm.check(ids, params)
        except ValueError as e:
            msg = str(e).splitlines()[0]
            field = msg.split(" ", 1)[0].rstrip(":")  # "temperature must be ...": the parameter it names
            mode = getattr(body, "tool_mode", lambda: None)()
            if field == "guided_json" and mode is not None and mode.kind != "auto":  # the schema came from the tools
                msg, field = f"tools: the call's schema (from the functions' parameters) is refused: {msg.split(': ', 1)[-1]}", "tools"
            raise ApiError(400, msg, param=field if field in type(body).model_fields else None) from None
        except EngineDeadError as e:  # no replica of the model left to serve it
            raise unavailable(e) from None
        asked = body.asked_max_tokens()
        if asked is not None and asked > room:  # as vLLM: refused, not silently cut at the context's end
            raise ApiError(400, f"this model's maximum context length is {llm.max_model_len} tokens, but {longest + asked} "
                                f"were requested ({longest} in the prompt, {asked} in the completion): lower max_tokens",
                           param="max_tokens")
        return params

    def prepare(self, body) -> tuple[list[list[int]], SamplingParams]:
        """Tokenise and check (run in a worker thread: a prompt of megabytes takes seconds)."""
        if isinstance(body, ChatCompletionRequest):
            ids = [self.encode_messages(body, body.add_generation_prompt)]
        else:
            try:
                ids = body.prompt_ids(self.engine(body))
            except ValueError as e:  # "<field>: why"
                field = str(e).split(":", 1)[0]
                raise ApiError(400, str(e), param=field if field in type(body).model_fields else None) from None
        if body.truncate_prompt_tokens is not None:  # the prompts as served: usage and echo count these (a bad
            # value is refused by make_params, as SamplingParams validates it)
            ids = [truncate_prompt(p, body.truncate_prompt_tokens, self.engine(body).max_model_len) for p in ids]
        return ids, self.make_params(body, ids)

    def encode_messages(self, body, add_generation_prompt: bool = True) -> list[int]:
        """body.messages (and its tools) through the model's chat template (a template's refusal: 400
        naming messages). Tools the model may call as it likes ("auto") need a template that lists
        them, as ollama asks; a call guided to its schema ("required", a named one) does not."""
        llm, tools = self.engine(body), body.template_tools()
        if tools and not llm.tokenizer.takes_tools:
            if not isinstance(body, ChatCompletionRequest):  # /tokenize: what would a chat with these tools be?
                raise ApiError(400, f"the chat template of `{self.name(body)}` takes no tools", param="tools")
            mode = body.tool_mode()
            if mode is not None and mode.kind == "auto":
                raise ApiError(400, f"the chat template of `{self.name(body)}` takes no tools, so it cannot choose to "
                                    "call one: give tool_choice \"required\" or a named function (its call is guided "
                                    "to the schema) or use a model whose template lists tools", param="tools")
            tools = None  # "none", or a call guided to its schema: the template goes without them
        try:
            conv = [m.template_dict() for m in body.messages]
            return llm.encode_chat(conv, add_generation_prompt, tools, body.continue_final_message, body.chat_template_kwargs)
        except ValueError as e:
            raise ApiError(400, f"messages: {str(e).splitlines()[0]}", param="messages") from None

    async def admit_and_prepare(self, body):
        """A slot in flight first (so a burst is refused before any work), then the prompt tokenised
        off the event loop (the tokenizer releases the GIL: /health and other streams go on)."""
        slot = self.in_flight.admit()
        try:
            ids, params = await asyncio.to_thread(self.prepare, body)
        except BaseException:
            slot.release()
            raise
        return slot, ids, params

    def new_choices(self, body, fmt: ChoiceFormat, n: int, prompts_ids: list[list[int]]) -> Choices:
        """The response's choice accumulator; its origin runs decode with the model's tokenizer, when asked."""
        tokenizer = self.engine(body).tokenizer
        runs = (lambda: OriginRuns(tokenizer)) if body.return_origins else None
        return Choices(fmt, n, sum(len(p) for p in prompts_ids), runs)

    async def respond(self, http: Request, slot, body, streams, choices: Choices, head: dict, whole_object: str):
        """Run the admitted generation, its slot held until the response has been sent; a client gone
        mid-way aborts it. head: a chunk's id, object, created and model; whole_object: the object a
        non-streamed response names instead (chat's "chat.completion" for its chunks' "chat.completion.chunk")."""
        if body.stream:
            async def events():
                async for chunk in self.chunks(body, streams, choices, head):
                    yield f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n"
                yield "data: [DONE]\n\n"
            return SlotStreamingResponse(events(), slot, media_type="text/event-stream")
        try:
            task = asyncio.ensure_future(self._whole(streams, choices, {**head, "object": whole_object}))
            while True:
                done, _ = await asyncio.wait({task}, timeout=0.5)
                if done:
                    return task.result()
                if await http.is_disconnected():
                    task.cancel()
                    return Response(status_code=499)
        finally:
            slot.release()

    async def chunks(self, body, streams, choices: Choices, head: dict) -> AsyncIterator[dict]:
        """A stream's events: a chunk per delta worth sending, then the usage if asked."""
        tr = RequestTracker(self.metrics, choices.prompt_tokens)
        try:
            async for pi, d in merged(streams):
                tr.see(choices.index(pi, d), d)
                if (e := dead_end(d)) is not None:
                    self.metrics.errors.labels(str(e.status)).inc()
                    yield error_body(e.message, e.type, e.status, e.param)
                    return  # merged, finalised, aborts the other samples
                choice = choices.chunk(pi, d)
                if choice is not None:
                    yield {**head, "choices": [choice]}
        except EngineDeadError as dead:  # the engine (or the replica) holding it stopped: this request ends here
            e = unavailable(dead)
            self.metrics.errors.labels(str(e.status)).inc()
            yield error_body(e.message, e.type, e.status, e.param)
            return
        tr.done()
        if body.stream_options is not None and body.stream_options.include_usage:
            yield {**head, "choices": [], "usage": choices.usage()}

    async def _whole(self, streams, choices: Choices, head: dict) -> dict:
        tr = RequestTracker(self.metrics, choices.prompt_tokens)
        try:
            async for pi, d in merged(streams):
                tr.see(choices.index(pi, d), d)
                if (e := dead_end(d)) is not None:
                    raise e
                choices.add(pi, d)
        except EngineDeadError as dead:
            raise unavailable(dead) from None
        tr.done()
        return {**head, "choices": choices.choices(), "usage": choices.usage()}


def unavailable(e: EngineDeadError) -> ApiError:
    """A request whose engine stopped under it (a replica killed, the engine loop failed): 503."""
    return ApiError(503, f"the engine serving this request stopped: {str(e).splitlines()[0] if str(e) else 'no reason given'}",
                    "service_unavailable")


def dead_end(d: StreamDelta) -> Optional[ApiError]:
    """A sample that finished with "error" (its grammar met a dead end: engine/guided.py): the
    request's constraint asks for what the model cannot write, a 400 (vLLM finishes such a request
    with "error" too). A non-streamed response raises it; a stream sends it as an error event."""
    if d.finish_reason != "error":
        return None
    return ApiError(400, d.error or "guided generation reached a dead end")


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
