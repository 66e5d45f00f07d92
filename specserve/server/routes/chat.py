"""/v1/chat/completions: a conversation (rendered by the model's chat template) answered; its choices
carry the assistant's "message" (streamed: "delta"s, the first with the role), its tool calls where
tools were given (server/tools.py), and chat logprobs ({"content": [{token, logprob, bytes, top_logprobs}]})."""
from __future__ import annotations

import time
import uuid
from typing import Callable, Optional

from fastapi import APIRouter, Request

from ...types import StreamDelta
from ..choices import json_logprob
from ..protocol import ChatCompletionRequest
from ..serving import Serving
from ..tools import ToolMode, ToolStream, merge_calls


class ChatChoice:
    """The ChoiceFormat (server/choices.py) of /v1/chat/completions. With tools, each choice's text goes
    through a ToolStream (server/tools.py): content, and the calls parsed or guided out of it."""

    delta_key, message_key = "delta", "message"

    def __init__(self, token_text: Callable[[int], str], tools: Optional[ToolMode] = None):
        self.token_text, self.tools = token_text, tools
        self._streams: dict[int, ToolStream] = {}

    def _split(self, c: int, d: StreamDelta) -> tuple[str, list[dict]]:
        """(content, tool-call entries) of choice c's delta."""
        if self.tools is None:
            return d.text, []
        if c not in self._streams:
            self._streams[c] = ToolStream(self.tools)
        return self._streams[c].push(d.text, d.finished)

    def delta(self, c: int, d: StreamDelta, first: bool) -> dict:
        delta = {}
        if first:  # OpenAI's clients take the role from a choice's first chunk
            delta["role"] = "assistant"
        content, calls = self._split(c, d)
        if content:
            delta["content"] = content
        if calls:
            delta["tool_calls"] = calls
        return delta

    def logprobs(self, c: int, d: StreamDelta, offset: int, first: bool) -> Optional[dict]:
        if d.logprobs is None:
            return None
        text = self.token_text
        content = []
        for j, (t, lp) in enumerate(zip(d.token_ids, d.logprobs)):
            s = text(t)
            tops = d.top_logprobs[j] if d.top_logprobs else {}
            content.append({"token": s, "logprob": json_logprob(lp), "bytes": list(s.encode()),
                            "top_logprobs": [{"token": text(i), "logprob": json_logprob(v), "bytes": list(text(i).encode())}
                                             for i, v in tops.items()]})
        return {"content": content}

    def start(self, c: int) -> dict:
        return {"role": "assistant", "content": ""}

    def extend(self, c: int, choice: dict, d: StreamDelta, lp: Optional[dict]) -> None:
        message = choice["message"]
        content, calls = self._split(c, d)
        message["content"] += content
        if calls:
            merge_calls(message, calls)
        if d.finished and message.get("tool_calls") and not message["content"]:
            message["content"] = None  # OpenAI's answer of calls alone
        if lp is not None:
            choice["logprobs"] = {"content": (choice["logprobs"] or {"content": []})["content"] + lp["content"]}

    def finish_reason(self, c: int, d: StreamDelta) -> Optional[str]:
        stream = self._streams.get(c)
        return d.finish_reason if stream is None else stream.finish_reason(d.finish_reason)


def router(s: Serving) -> APIRouter:
    r = APIRouter()

    @r.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, http: Request):
        s.check_common(body)
        slot, ids, params = await s.admit_and_prepare(body)
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        streams = [s.engine(body).generate(ids[0], params)]  # one conversation: its samples are choices 0..n-1
        choices = s.new_choices(body, ChatChoice(s.token_text(body), body.tool_mode()), params.n, ids)
        head = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": s.name(body)}
        return await s.respond(http, slot, body, streams, choices, head, "chat.completion")

    return r
