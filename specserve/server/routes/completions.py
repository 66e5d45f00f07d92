"""/v1/completions: prompts (one or a list, text or token ids) completed; its choices carry "text"
and OpenAI's legacy logprobs (tokens, token_logprobs, top_logprobs, text_offset)."""
from __future__ import annotations

import time
import uuid
from typing import Callable, Optional

from fastapi import APIRouter, Request

from ...types import StreamDelta
from ..errors import ApiError
from ..protocol import CompletionRequest
from ..serving import Serving


class CompletionChoice:
    """The ChoiceFormat (server/choices.py) of /v1/completions: the body is the text, streamed or whole."""

    delta_key = message_key = "text"

    def __init__(self, token_text: Callable[[int], str]):
        self.token_text = token_text

    def delta(self, d: StreamDelta, first: bool) -> str:
        return d.text

    def logprobs(self, d: StreamDelta, offset: int) -> Optional[dict]:
        if d.logprobs is None:
            return None
        toks = [self.token_text(t) for t in d.token_ids]
        offsets, o = [], offset
        for t in toks:
            offsets.append(o)
            o += len(t)
        tops = [{self.token_text(i): lp for i, lp in top.items()} for top in d.top_logprobs] if d.top_logprobs else None
        return {"tokens": toks, "token_logprobs": d.logprobs, "top_logprobs": tops, "text_offset": offsets}

    def start(self) -> str:
        return ""

    def extend(self, choice: dict, d: StreamDelta, lp: Optional[dict]) -> None:
        if lp is not None:
            if choice["logprobs"] is None:
                choice["logprobs"] = {"tokens": [], "token_logprobs": [], "top_logprobs": [] if lp["top_logprobs"] is not None
                                      else None, "text_offset": []}
            for k in ("tokens", "token_logprobs", "text_offset"):
                choice["logprobs"][k] += lp[k]
            if lp["top_logprobs"] is not None:  # None so far where the choice's first delta had no tokens
                choice["logprobs"]["top_logprobs"] = (choice["logprobs"]["top_logprobs"] or []) + lp["top_logprobs"]
        choice["text"] += d.text


def router(s: Serving) -> APIRouter:
    r = APIRouter()

    @r.post("/v1/completions")
    async def completions(body: CompletionRequest, http: Request):
        s.check_common(body)
        prompts = body.prompts()
        if not 1 <= len(prompts) <= s.cfg.max_prompts:
            raise ApiError(400, f"prompt must hold 1 to {s.cfg.max_prompts} prompts", param="prompt")
        slot, ids, params = await s.admit_and_prepare(body, prompts)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        streams = [s.engine(body).generate(p, params) for p in ids]
        choices = s.new_choices(body, CompletionChoice(s.token_text(body)), params.n, ids)  # prompt i's sample k: choice i * n + k
        head = {"id": rid, "object": "text_completion", "created": created, "model": s.name(body)}
        return await s.respond(http, slot, body, streams, choices, head, "text_completion")

    return r
