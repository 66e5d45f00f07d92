"""llama-server's /infill: fill-in-the-middle for code editors (llama.vscode, llama.vim and the plugins
written against llama-server).

The body's input_prefix, input_suffix, input_extra (the repository's other files, [{"filename",
"text"}]) and prompt (text typed at the cursor) become the prompt llama.cpp's format_prompt_infill
builds (repository_prompt below), tokenised once the request holds its slot; then it runs the path
/v1/completions runs (serving.py: the same checks, in-flight limit, metrics, aborts and API key).
The answer is llama-server's /completion object (content, stop, stop_type, tokens_predicted,
tokens_evaluated, timings; only response_fields' paths where it names some), or SSE events of the
same keys without a [DONE].

As llama-server: its sampling defaults (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05), and
`samplers` names the steps that run (llama.vscode sends ["top_k", "top_p", "infill"]: no temperature,
so 1, and no min-p); n_predict -1 (the default) runs until a stop or the context's end; n_indent
ends the middle at a line indented less (that line cut), t_max_predict_ms at the first new line past
that time. n_predict 0 is llama.vscode's warm-up: the prompt is computed, so the next request finds
it in the prefix cache (timings.cache_n: the tokens it held; prompt_n: those computed), and nothing
is returned. Not as llama-server: the "infill" sampler step (it merges tokens that share a prefix and
weighs the end of the middle) is not run; cache_prompt is ignored (prefix caching is the engine's,
in 16-token blocks where llama-server reuses a slot's common prefix token by token).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, AsyncIterator, Callable, ClassVar, Optional

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ...loading.infill import frame
from ...types import StreamDelta
from ..errors import ApiError
from ..serving import Serving
from .completions import CompletionChoice
from .translated import FillingCompletion, RequestError, answer, mapped, read_json, sse, validated, without_nulls

N_BATCH = 2048  # llama-server's default batch: the FIM part is fitted into one (format_prompt_infill)
# Room kept for the middle where the other files are cut to fit the context, whatever a request asks,
# so a warm-up (n_predict 0) and the request it warms build the same prompt. llama.cpp takes its
# server-wide n_predict (-1 by default: it keeps n_ctx - n_batch + 2 of the files, up to the context's
# last tokens); this keeps twice llama.vscode's default n_predict of 128, so the files' cut differs
# from llama.cpp's where they overflow the context. A longer middle is cut at the context's end.
MIDDLE_ROOM = 2 * 128
SNIPPET = "\n\n--- snippet ---\n\n"  # llama.cpp's separator of two files where the model has no file separator
# llama-server's fields -> the OpenAI request's, and its defaults (common/common.h common_params_sampling)
FIELDS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p", "seed": "seed",
          "stop": "stop", "repeat_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
          "frequency_penalty": "frequency_penalty"}
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
# a sampling step left out of `samplers` does not run: (its char, its fields' neutral values)
NEUTRAL = {"temperature": ("t", {"temperature": 1.0}), "top_k": ("k", {"top_k": -1}), "top_p": ("p", {"top_p": 1.0}),
           "min_p": ("m", {"min_p": 0.0}),
           "penalties": ("e", {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0})}
ALIASES = {"topk": "top_k", "topp": "top_p", "minp": "min_p", "nucleus": "top_p", "temp": "temperature"}  # llama.cpp's


def sampler_name(name: str) -> str:
    """A `samplers` name as llama.cpp reads it: canonical, kebab-case, without the dash, or an alias."""
    name = name.lower().replace("-", "_")
    return ALIASES.get(name, name)


def repository_prompt(tok, prefix: str, suffix: str, prompt: str = "", files: list[tuple[str, str]] = (),
                      n_batch: int = N_BATCH, n_ctx: int = 0, room: int = MIDDLE_ROOM) -> list[int]:
    """llama.cpp's format_prompt_infill (tools/server/server-common.cpp), spm_infill off: Qwen2.5-Coder's
    repository layout, then the FIM prompt with the text typed at the cursor after the prefix:

        [FIM_REP] "myproject\\n" ([FIM_SEP] name "\\n" text)* [FIM_SEP] "filename\\n" [BOS] [FIM_PRE] prefix prompt
        [FIM_SUF] suffix [FIM_MID]

    (without FIM_SEP each file's text follows SNIPPET; without FIM_REP no project line). The FIM part
    fits one batch: the prefix's last 3/4 n_batch tokens, the suffix's first n_batch/4 - 2 - len(prompt);
    of the files' tokens the last n_ctx - n_batch - room. tok: a Tokenizer (code as plain text; the
    typed prompt with special tokens read, as llama-server reads it)."""
    fim = tok.fim
    pre, suf, said = tok.encode_text(prefix), tok.encode_text(suffix), tok.encode(prompt, add_special_tokens=False)
    extra = [fim.rep] + tok.encode_text("myproject\n") if fim.rep is not None else []
    for name, text in files:
        extra += ([fim.sep] + tok.encode_text(name + "\n")) if fim.sep is not None else tok.encode_text(SNIPPET)
        extra += tok.encode_text(text)
    if fim.sep is not None:
        extra += [fim.sep] + tok.encode_text("filename\n")
    pre = pre[len(pre) - min(len(pre), 3 * (n_batch // 4)):]
    suf = suf[:max(0, n_batch // 4 - (2 + len(said)))]
    extra = extra[len(extra) - min(max(0, n_ctx - n_batch - room), len(extra)):]
    return extra + frame(fim, pre + said, suf, tok.bos_token_id if tok.add_bos else None)


class InfillRequest(FillingCompletion):
    """/infill's request as the serving path runs it: its prompt is built in prompt_ids, in the worker
    thread once the request holds its slot (a repository's files are megabytes to tokenise)."""
    prompt: Any = ""
    input_prefix: str
    input_suffix: str
    input_extra: list[tuple[str, str]] = []
    typed: str = ""  # llama-server's `prompt`

    clamps_length: ClassVar[bool] = True  # an n_predict past the room left: to the context's end

    def prompt_ids(self, llm) -> list[list[int]]:
        return [repository_prompt(llm.tokenizer, self.input_prefix, self.input_suffix, self.typed, self.input_extra,
                                  n_ctx=min(llm.max_model_len, llm.cache_tokens))]


def request_fields(body: dict, max_model_len: int) -> tuple[dict, int]:
    """(the OpenAI request's fields, n_predict) from llama-server's (a null is as if unset)."""
    body = without_nulls(body)
    out: dict[str, Any] = mapped(body, FIELDS, DEFAULTS)
    samplers = body.get("samplers")
    if samplers is not None:
        if not (isinstance(samplers, str) or (isinstance(samplers, list) and all(isinstance(x, str) for x in samplers))):
            raise RequestError(400, '"samplers" must be an array of sampler names or a string of sampler chars')
        named = set(samplers) if isinstance(samplers, str) else {sampler_name(x) for x in samplers}
        for name, (char, neutral) in NEUTRAL.items():
            if (char if isinstance(samplers, str) else name) not in named:
                out.update(neutral)
    n = body.get("n_predict", -1)
    if isinstance(n, bool) or not isinstance(n, int):
        raise RequestError(400, f'"n_predict" must be an integer, got {n!r}')
    if n == 0:  # the warm-up: compute (and cache) the prompt, say nothing
        out["max_tokens"] = 1
    elif 0 < n < max_model_len:
        out["max_tokens"] = n
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(400, f'"stream" must be true or false, got {stream!r}')
    return {**out, "stream": stream, "stream_options": {"include_usage": True} if stream else None}, n


def files_of(body: dict) -> list[tuple[str, str]]:
    extra = body.get("input_extra")
    if extra is None:
        return []
    if not isinstance(extra, list):
        raise RequestError(400, '"input_extra" must be an array of {"filename": string, "text": string}')
    out = []
    for chunk in extra:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise RequestError(400, 'extra_context chunk must contain a "text" field with a string value')
        name = chunk.get("filename", "tmp")
        if not isinstance(name, str):
            raise RequestError(400, 'extra_context chunk\'s "filename" field must be a string')
        out.append((name, chunk["text"]))
    return out


def nested(paths: list[str], obj: dict) -> dict:
    """llama-server's response_fields: {path: the value at "a/b"} for each path the object has."""
    out = {}
    for path in paths:
        cur: Any = obj
        for key in path.split("/"):
            if not (isinstance(cur, dict) and key in cur):
                break
            cur = cur[key]
        else:
            out[path] = cur
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
            body = await read_json(http)
            name = (body.get("model") or None) if len(s.models) > 1 else None  # llama-server serves one model, reads no name
            if name is not None and (not isinstance(name, str) or name not in s.models):
                raise s.unknown_model(str(name))
            llm = s.models[name or s.model_name]
            if not llm.tokenizer.fim.can_infill:
                raise RequestError(501, "Infill is not supported by this model: its vocabulary has no FIM "
                                        f"{', '.join(llm.tokenizer.fim.missing())} token")
            for key in ("input_prefix", "input_suffix"):
                if not isinstance(body.get(key), str):
                    raise RequestError(400, f'"{key}" is required' if key not in body else f'"{key}" must be a string')
            if body.get("prompt") is not None and not isinstance(body["prompt"], str):
                raise RequestError(400, '"prompt" must be a string')
            stops = Stops(body)
            picked = body.get("response_fields")
            if picked is not None and not (isinstance(picked, list) and all(isinstance(p, str) for p in picked)):
                raise RequestError(400, '"response_fields" must be an array of strings')
            fields, n_predict = request_fields(body, llm.max_model_len)
            req = validated(InfillRequest, model=name or s.model_name, input_prefix=body["input_prefix"],
                            input_suffix=body["input_suffix"], input_extra=files_of(body), typed=body.get("prompt") or "",
                            **fields)
            s.check_common(req)
            slot, ids, params = await s.admit_and_prepare(req)
        except RequestError as e:
            return failed(e.status, e.message)
        except ApiError as e:
            return failed(e.status, e.message, e.headers)
        tok = llm.tokenizer
        reply = _Reply(name or s.model_name, len(ids[0]), n_predict == 0, picked, stops,
                       lambda t: tok.decode([t]), t0)
        streams = [reply.timed(llm.generate(ids[0], params))]
        choices = s.new_choices(req, CompletionChoice(s.token_text(req)), 1, ids)
        return await answer(s, http, slot, req, streams, choices, reply.event, reply.whole, failed,
                            "text/event-stream", sse)

    return r


class Stops:
    """llama-server's stops on the text, its process_token line for line (server-context.cpp), fed
    one token's text at a time (_Reply.timed): n_indent ends the middle at a line indented less than
    it (that line's text cut, its indentation kept), checked from the token after the one that began
    the first line; t_max_predict_ms ends it at a token with a new line once that long has passed
    since the first token."""

    def __init__(self, body: dict):
        for key in ("n_indent", "t_max_predict_ms"):
            v = body.get(key) or 0
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise RequestError(400, f'"{key}" must be a number, got {v!r}')
            setattr(self, key, v)
        self.text, self.line, self.has_new_line = "", 0, False  # the middle so far; the line checked (0: none)

    def cut(self, piece: str, since_first_s: float) -> tuple[str, bool]:
        """(the piece as sent, whether the middle ends here)."""
        start = len(self.text)
        self.text += piece
        if self.has_new_line and self.n_indent > 0:
            if self.line > 0:
                pos = self.line
                while pos < len(self.text) and self.text[pos] in " \t":
                    pos += 1
                if pos < len(self.text) and pos - self.line < self.n_indent:
                    self.text = self.text[:pos]
                    return self.text[start:], True
            nl = self.text.find("\n", self.line)
            if nl >= 0:
                self.line = nl + 1
        if "\n" in piece:
            self.has_new_line = True
            if self.t_max_predict_ms > 0 and since_first_s * 1e3 > self.t_max_predict_ms:
                return piece, True
        return piece, False


class _Reply:
    """OpenAI chunks or a whole response -> llama-server's /completion objects: an event per piece of
    text, then the last with stop, stop_type and timings."""

    def __init__(self, model: str, prompt_n: int, warm_up: bool, fields: Optional[list], stops: Stops,
                 token_text: Callable[[int], str], t0: float):
        self.model, self.prompt_n, self.warm_up, self.fields, self.t0 = model, prompt_n, warm_up, fields, t0
        self.stops, self.token_text = stops, token_text  # token_text(id): its text, special tokens dropped
        self.first: Optional[float] = None  # when the first token came: the prompt's time ends there
        self.predicted = 0
        self.text = ""  # the middle sent so far
        self.finish: Optional[str] = None  # the choice's finish_reason and stop_reason, from its last chunk
        self.stop_reason: Any = None

    async def timed(self, stream: AsyncIterator[StreamDelta]) -> AsyncIterator[StreamDelta]:
        """The engine's deltas counted and timed, llama-server's text stops applied (one ends the
        middle: closing the engine's stream aborts the request)."""
        try:
            async for d in stream:
                now = time.perf_counter()
                if self.first is None and d.token_ids:
                    self.first = now
                self.predicted += len(d.token_ids)
                # llama-server checks after each token: a verify step's tokens one by one (their texts, where
                # they add up to the delta's: not where a stop string holds text back or a character spans two)
                pieces = [self.token_text(t) for t in d.token_ids]
                if "".join(pieces) != d.text:
                    pieces = [d.text]
                sent, end = "", False
                for piece in pieces:
                    text, end = self.stops.cut(piece, now - (self.first or now))
                    sent += text
                    if end:
                        break
                if end:
                    yield dataclasses.replace(d, text=sent, finish_reason=d.finish_reason or "length")
                    return
                yield d
        finally:
            await stream.aclose()

    def _last(self, text: str, usage: dict) -> dict:
        end = time.perf_counter()
        first = self.first or end
        predicted = 0 if self.warm_up else usage["completion_tokens"]
        prompt_ms, predicted_ms = (first - self.t0) * 1e3, (end - first) * 1e3
        word = self.stop_reason if isinstance(self.stop_reason, str) else ""
        stop_type = "limit" if self.warm_up or self.finish == "length" else "word" if word else "eos"
        cached = usage["prompt_tokens_details"]["cached_tokens"]  # llama-server's cache_n: its prompt_n excludes them
        computed = self.prompt_n - cached
        obj = {"index": 0, "content": text, "tokens": [], "id_slot": 0, "stop": True, "model": self.model,
               "tokens_predicted": predicted, "tokens_evaluated": self.prompt_n, "has_new_line": "\n" in self.text,
               "truncated": False, "stop_type": stop_type, "stopping_word": word, "tokens_cached": self.prompt_n + predicted,
               "timings": {"cache_n": cached, "prompt_n": computed, "prompt_ms": prompt_ms,
                           "prompt_per_token_ms": prompt_ms / max(1, computed),
                           "prompt_per_second": computed / max(1e-9, prompt_ms / 1e3),
                           "predicted_n": predicted, "predicted_ms": predicted_ms,
                           "predicted_per_token_ms": predicted_ms / max(1, predicted),
                           "predicted_per_second": predicted / max(1e-9, predicted_ms / 1e3)}}
        return nested(self.fields, obj) if self.fields else obj

    def event(self, chunk: dict) -> Optional[dict]:
        if "error" in chunk:
            return chunk
        if "usage" in chunk:
            return self._last("", chunk["usage"])
        choice = chunk["choices"][0]
        if choice["finish_reason"] is not None:
            self.finish, self.stop_reason = choice["finish_reason"], choice.get("stop_reason")
        text = "" if self.warm_up else choice.get("text", "")
        if not text:
            return None
        self.text += text
        return {"index": 0, "content": text, "tokens": [], "stop": False, "id_slot": 0,
                "tokens_predicted": self.predicted, "tokens_evaluated": self.prompt_n}

    def whole(self, response: dict) -> dict:
        choice = response["choices"][0]
        self.finish, self.stop_reason = choice["finish_reason"], choice.get("stop_reason")
        # the middle as cut (a line indented less than n_indent), where the deltas sent could not be
        self.text = "" if self.warm_up else self.stops.text
        return self._last(self.text, response["usage"])

